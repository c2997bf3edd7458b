"""Trainer overhead on an overhead-dominated loop.

The same tiny MLP (Linear 32-64, ReLU, Linear 64-10; batch 64; SGD; one thread; CPU) for
2000 steps: the plain PyTorch loop, hasten's Trainer (progress bar and JSONL logger on,
output to a file; bare, to show their share; and with a user's own loss returning the batch
mean, where none of the default loss's special cases apply), and, when installed,
Lightning (bare, and with its progress bar and CSV logger). Runs alternate in one process, in forward then reverse order from round to
round; reported: the median time ratio to the plain loop of the same round, with a
distribution-free 95% interval, and the overhead in microseconds per step. hasten's
host allocator settings (what `hasten train` applies on the CPU) are applied before the
first loop, so every loop runs under them.

    python -m benchmarks.comparisons.trainer_overhead [--steps 2000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F
from rich.console import Console
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.tools.common import write_results  # noqa: E402

from hasten import Trainer  # noqa: E402
from hasten.allocator import configure_host_allocator  # noqa: E402
from hasten.callbacks import ProgressBar  # noqa: E402
from hasten.loggers import JSONLLogger  # noqa: E402


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def make_loader(steps: int) -> DataLoader:
    """`steps` batches of 64 random inputs (32 features) and class ids (10 classes), the same every call."""
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(steps * 64, 32, generator=g),
                                    torch.randint(0, 10, (steps * 64,), generator=g)), batch_size=64)


def plain(loader, steps):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t0 = time.perf_counter()
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


def user_loss(outputs, targets):
    """A user's own loss, returning the batch mean: none of the default loss's special cases apply."""
    return F.cross_entropy(outputs, targets)


def hasten(loader, steps, out_dir, bare: bool = False, loss_fn=None):
    model = make_model()
    log = open(os.path.join(out_dir, "progress.txt"), "w")
    tr = Trainer(model, loader, optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.01),
                 max_duration=f"{steps}ba", device="cpu", loss_fn=loss_fn,
                 callbacks=[] if bare else [ProgressBar(console=Console(file=log))],
                 loggers=[] if bare else [JSONLLogger(os.path.join(out_dir, "metrics.jsonl"))])
    t0 = time.perf_counter()
    tr.fit()
    dt = time.perf_counter() - t0
    tr.close()
    log.close()
    return dt


def run_lightning(loader, steps, out_dir, extras: bool):
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = make_model()

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.model(x), y)
            if extras:
                self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    kwargs = dict(max_steps=steps, accelerator="cpu", devices=1, enable_checkpointing=False,
                  enable_model_summary=False, num_sanity_val_steps=0)
    if extras:
        kwargs.update(enable_progress_bar=True, logger=L.pytorch.loggers.CSVLogger(out_dir), log_every_n_steps=50)
    else:
        kwargs.update(enable_progress_bar=False, logger=False)
    trainer = L.Trainer(**kwargs)
    module = Module()
    stdout = sys.stdout
    sys.stdout = open(os.path.join(out_dir, "lightning.txt"), "w")
    try:
        t0 = time.perf_counter()
        trainer.fit(module, loader)
        dt = time.perf_counter() - t0
    finally:
        sys.stdout.close()
        sys.stdout = stdout
    return dt


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of a median: the order statistics whose ranks
    bracket it with probability >= level under the binomial(n, 1/2) law of the count below it."""
    from math import comb
    xs, n = sorted(values), len(values)
    cdf, k = 0.0, 0
    while k < n:   # largest k with P(Binomial(n, 1/2) < k) <= (1 - level) / 2
        nxt = cdf + comb(n, k) / 2 ** n
        if nxt > (1 - level) / 2:
            break
        cdf, k = nxt, k + 1
    if k == 0:
        return xs[0], xs[-1]
    return xs[k - 1], xs[n - k]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--no-lightning", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    loader = make_loader(args.steps)
    runners = {"plain": lambda d: plain(loader, args.steps), "hasten": lambda d: hasten(loader, args.steps, d),
               "hasten (no bar, no logger)": lambda d: hasten(loader, args.steps, d, bare=True),
               "hasten (user loss)": lambda d: hasten(loader, args.steps, d, loss_fn=user_loss)}
    try:
        if not args.no_lightning:
            import lightning  # noqa: F401
            import logging
            logging.getLogger("lightning").setLevel(logging.ERROR)
            logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
            runners["lightning"] = lambda d: run_lightning(loader, args.steps, d, extras=False)
            runners["lightning+bar+logger"] = lambda d: run_lightning(loader, args.steps, d, extras=True)
    except ImportError:
        pass
    times = {k: [] for k in runners}
    cpu = {k: [] for k in runners}   # CPU seconds of the whole call (set-up included)
    # hasten train fixes glibc malloc's settings for the whole process on the CPU
    # (hasten.allocator); fix them before any loop runs, so that every loop, the plain one's
    # first round included, runs under the same allocator.
    configure_host_allocator("auto", "cpu")
    plain(loader, 200)  # warm-up
    for r in range(args.rounds):
        # alternate the order (ABBA...): drifts in machine speed then fall on every loop alike
        order = list(runners.items()) if r % 2 == 0 else list(runners.items())[::-1]
        for name, fn in order:
            with tempfile.TemporaryDirectory() as d:
                gc.collect()
                c0 = time.process_time()
                times[name].append(fn(d))
                cpu[name].append(time.process_time() - c0)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items()), flush=True)
    base = times["plain"]
    rows, data = [], {"steps": args.steps, "rounds": args.rounds, "times_s": times, "cpu_s": cpu, "summary": {}}
    for name, ts in times.items():
        ratios = [t / b for t, b in zip(ts, base)]
        med_ratio = statistics.median(ratios)
        lo, hi = median_ci(ratios)
        over_us = (statistics.median(ts) - statistics.median(base)) / args.steps * 1e6
        best_ratio = min(ts) / min(base)
        cpu_ratio = statistics.median(c / b for c, b in zip(cpu[name], cpu["plain"]))
        data["summary"][name] = {"median_s": statistics.median(ts), "median_ratio": med_ratio, "median_ratio_ci95": [lo, hi],
                                 "min_ratio": min(ratios), "max_ratio": max(ratios), "ratio_of_best": best_ratio,
                                 "median_cpu_ratio": cpu_ratio,
                                 "overhead_us_per_step": over_us}
        rows.append(f"| {name} | {statistics.median(ts):.3f} | {med_ratio:.3f} [{lo:.3f}, {hi:.3f}] ({min(ratios):.3f}-{max(ratios):.3f}) "
                    f"| {best_ratio:.3f} | {cpu_ratio:.3f} | {over_us:+.1f} |")
    md = ("# Trainer overhead (tiny MLP, 2000 steps, batch 64, 1 thread, CPU)\n\n"
          f"{args.rounds} rounds in one process, the order reversed every other round; ratio = time / plain loop time of the same round; "
          "the 95% interval of the median ratio is distribution-free (order statistics); glibc malloc's settings "
          "are fixed (as hasten train fixes them) before the first loop runs.\n\n"
          "| loop | median time (s) | median ratio [95% CI] (min-max) | best / best | median CPU-time ratio | overhead (us/step, medians) |\n"
          "|---|---|---|---|---|---|\n"
          + "\n".join(rows))
    write_results("trainer_overhead", data, md)
    print(md)


if __name__ == "__main__":
    main()
