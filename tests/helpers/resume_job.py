"""A small training job for resume tests: run it straight, kill it, terminate it, resume it.

usage: resume_job.py FOLDER TOTAL_BATCHES MODE STOP_AT OUT LOADER
  MODE: straight | kill (SIGKILL after batch STOP_AT) | term (SIGTERM after batch STOP_AT) | resume
  LOADER: hasten (seeded per-sample augmentation, 2 workers) | plain (DataLoader, shuffle, main-process augmentation)
"""
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hasten import Algorithm, Trainer
from hasten.algorithms import EMA
from hasten.data import TensorPairs, make_dataloader

folder, total, mode, stop_at, out, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
torch.set_num_threads(1)

g = torch.Generator().manual_seed(123)
X = torch.randn(96, 8, generator=g)
Y = (X @ torch.randn(8, 4, generator=g)).argmax(1)


def noise(x, gen):
    return x + 0.1 * torch.randn(x.shape, generator=gen)


class GlobalNoise(Dataset):  # augmentation from the global RNG, as a plain dataset would do it
    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return X[i] + 0.1 * torch.randn(8), Y[i]


if kind == "hasten":
    train = make_dataloader(TensorPairs(X, Y), batch_size=8, shuffle=True, seed=1, transform=noise, num_workers=2)
else:
    train = DataLoader(GlobalNoise(), batch_size=8, shuffle=True, num_workers=0)


class Stopper(Algorithm):
    def checkpoint(self, state, logger):
        if state.timestamp.batch == stop_at and not state.at_epoch_end:
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif mode == "term":
                os.kill(os.getpid(), signal.SIGTERM)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))
ema = EMA(decay=0.9, final_swap=False)
trainer = Trainer(model, train, optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                  max_duration=f"{total}ba", device="cpu", seed=7, save_folder=folder, save_interval="5ba",
                  autoresume=(mode == "resume"), algorithms=[ema, Stopper()], log_interval="4ba")
start = trainer.state.timestamp.batch
trainer.fit()
torch.save({"model": model.state_dict(), "ema": ema.ema, "start": start, "batch": trainer.state.timestamp.batch,
            "reason": trainer.state.stop_reason}, out)
