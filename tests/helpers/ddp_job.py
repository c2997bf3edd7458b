"""A small training job for the data-parallel tests: run it alone, or as each of N processes
with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    python ddp_job.py MODEL OUT.pt [GRAD_ACCUM]

MODEL: mlp, gpt, convbn (a conv net with batch norm), or convbn-ghost4 (the same with ghost
batch norm of 4 samples, the per-rank batch of two processes). Rank 0 writes the final weights, the evaluation and the logged training
losses to OUT.pt."""
import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
from hasten import Trainer, make_runtime  # noqa: E402
from hasten.loggers.base import LoggerDestination  # noqa: E402


class Remember(LoggerDestination):
    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step):
        self.rows.append({"step": step, **metrics})


def main(model_name: str, out: str, grad_accum: int = 1, sigterm_rank1_at: int = 0, save: str = "") -> None:
    torch.set_num_threads(1)
    rt = make_runtime(device="cpu", seed=0, timeout_s=60)
    g = torch.Generator().manual_seed(1)
    if model_name == "mlp":
        x, y = torch.randn(96, 8, generator=g), torch.randint(0, 4, (96,), generator=g)
        ex, ey = torch.randn(33, 8, generator=g), torch.randint(0, 4, (33,), generator=g)   # 33: odd on purpose
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        from torchmetrics.classification import MulticlassAccuracy
        metrics = {"acc": MulticlassAccuracy(4, average="micro")}
        train = DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True)   # shards of 5, or 3 and 2
        evald = DataLoader(TensorDataset(ex, ey), batch_size=8)
        opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)   # noqa: E731
    elif model_name.startswith("convbn"):
        x, y = torch.randn(64, 3, 8, 8, generator=g), torch.randint(0, 4, (64,), generator=g)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                              nn.Linear(8 * 8 * 8, 4))
        metrics = {}
        train = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
        evald = None
        opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.05)   # noqa: E731
    else:
        from hasten.data import RandomWindows
        from hasten.data.text import EvalWindows
        from hasten.models.gpt import GPT, GPTConfig
        tokens = torch.randint(0, 11, (2000,), generator=g)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=11, block_size=16, dropout=0.0))
        metrics = {}
        train = RandomWindows(tokens[:1500], block_size=16, batch_size=6, seed=0)
        evald = EvalWindows(tokens[1500:], block_size=16, batch_size=5)
        opt = lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3)   # noqa: E731
    logger = Remember()
    algos = []
    if model_name == "convbn-ghost4":
        from hasten.algorithms import GhostBatchNormAlgorithm
        algos = [GhostBatchNormAlgorithm(ghost_size=4)]
    if sigterm_rank1_at and rt.world.rank == 1:   # a signal that reaches one rank only
        import signal

        from hasten import Algorithm

        class Term(Algorithm):
            def batch_end(self, state, logger):
                if state.timestamp.batch == sigterm_rank1_at:
                    os.kill(os.getpid(), signal.SIGTERM)
        algos.append(Term())
    kill_at = int(os.environ.get("JOB_KILL_AT", 0))   # every rank SIGKILLs itself after this batch's checkpoint point
    if kill_at:
        import signal

        from hasten import Algorithm

        class Kill(Algorithm):
            def checkpoint(self, state, logger):
                if state.timestamp.batch == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
        algos.append(Kill())
    tr = Trainer(model, train, optimizers=opt, max_duration="12ba", eval_dataloader=evald, eval_interval="6ba",
                 log_interval="3ba", metrics=metrics, loggers=[logger], runtime=rt, grad_accum=grad_accum,
                 algorithms=algos, save_folder=save or None, save_interval=os.environ.get("JOB_SAVE_EVERY", "100ba"),
                 autoresume=bool(save) and os.environ.get("JOB_RESUME") == "1")
    tr.fit()
    with open(f"{out}.rank{rt.world.rank}.json", "w") as f:
        json.dump({"batch": tr.state.timestamp.batch, "stop_reason": tr.state.stop_reason,
                   "last_checkpoint": tr.state.last_checkpoint}, f)
    if rt.world.is_main:
        torch.save({"weights": {k: v.clone() for k, v in tr.state.model.state_dict().items()},
                    "eval": tr.state.eval_metrics, "logged": logger.rows, "world": rt.world.size,
                    "samples": tr.state.timestamp.sample}, out)
    rt.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1,
         int(sys.argv[4]) if len(sys.argv) > 4 else 0, sys.argv[5] if len(sys.argv) > 5 else "")
