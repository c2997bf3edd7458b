"""Two ranks; rank 1 is killed (SIGKILL) at batch 5. Rank 0 must stop with an error naming it."""
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Algorithm, Trainer, make_runtime
from hasten.errors import HastenError

rt = make_runtime(device="cpu", seed=0, timeout_s=30)


class Die(Algorithm):
    def batch_end(self, state, logger):
        if rt.world.rank == 1 and state.timestamp.batch == 5:
            os.kill(os.getpid(), signal.SIGKILL)


x, y = torch.randn(400, 8), torch.randint(0, 4, (400,))
try:
    Trainer(nn.Linear(8, 4), DataLoader(TensorDataset(x, y), batch_size=8), max_duration="40ba", runtime=rt,
            algorithms=[Die()]).fit()
except HastenError as e:
    print(f"hasten: error: {e}", flush=True)
    sys.exit(1)
