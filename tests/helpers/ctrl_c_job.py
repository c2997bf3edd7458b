"""Train with a plain DataLoader whose workers do not ignore Ctrl-C; the test sends SIGINT to
the whole process group, as a terminal does. usage: ctrl_c_job.py FOLDER"""
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

from hasten import Trainer


class Slow(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(8), i % 4


loader = DataLoader(Slow(), batch_size=8, num_workers=2)
trainer = Trainer(torch.nn.Linear(8, 4), loader, max_duration="1000ba", device="cpu", save_folder=sys.argv[1],
                  save_interval="100000ba", log_interval="5ba")
print("started", flush=True)
trainer.fit()
print("stopped", trainer.state.stop_reason, trainer.state.timestamp.batch, flush=True)
