"""Systems choices for conv nets on this machine, measured side by side.

A. Training-step throughput of the speedrun net (random data, SGD) in fp32 or bf16 autocast,
   NCHW or channels-last, at two widths. Configurations are interleaved round by round;
   the table gives medians over rounds and the ratio to the first precision's NCHW column. `--compile` adds
   channels-last columns under `torch.compile` (default options) and reports each one's
   first-call cost (tracing and code generation, cold cache) apart from its step rate.
   `--precisions fp32` skips bf16, which runs emulated and slowly on CPUs without
   AVX512-BF16 or AMX.
B. Batches per second from the DeviceLoader (uint8 on the device, whole-batch translate +
   flip, channels-last) against a host DataLoader with worker processes and per-sample
   crop + flip (what `cifar10-baseline` uses), on CIFAR-shaped random images.

    python -m benchmarks.comparisons.vision_systems [--rounds 5] [--compile] [--precisions fp32 bf16] [--name vision_systems]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from benchmarks.tools.common import write_results
from hasten.data import DeviceLoader, TensorPairs, make_dataloader
from hasten.data.transforms import RandomCropFlip
from hasten.models import SpeedrunNet


def configs(precisions=("fp32", "bf16"), compile: bool = False) -> list[tuple[str, bool, bool]]:
    """(precision, channels-last, compiled) for every column, eager ones first."""
    out = [(p, cl, False) for p in precisions for cl in (False, True)]
    return out + ([(p, True, True) for p in precisions] if compile else [])


def label(prec: str, cl: bool, compiled: bool) -> str:
    return f"{prec}/{'channels_last' if cl else 'nchw'}" + ("/compiled" if compiled else "")


def step_rate(forward, x, y, opt, bf16: bool, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(forward(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return steps * len(x) / (time.perf_counter() - t0)


def bench_steps(widths, rounds: int, cols, batch: int = 256, steps: int = 6) -> tuple[dict, dict]:
    """Median images/s per column, and each compiled column's first-call cost in seconds."""
    torch.manual_seed(0)
    setups, first_call = {}, {}
    for prec, cl, compiled in cols:
        m = SpeedrunNet(widths=widths)
        x = torch.randn(batch, 3, 32, 32)
        if cl:
            m, x = m.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
        forward = torch.compile(m) if compiled else m
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, nesterov=True)
        y = torch.randint(0, 10, (batch,))
        t0 = time.perf_counter()
        step_rate(forward, x, y, opt, prec == "bf16", 1)   # warm-up; compiles a compiled column
        if compiled:
            first_call[label(prec, cl, compiled)] = time.perf_counter() - t0
        step_rate(forward, x, y, opt, prec == "bf16", 1)
        setups[(prec, cl, compiled)] = (forward, x, y, opt)
    rates = {k: [] for k in setups}
    for _ in range(rounds):
        for k, (forward, x, y, opt) in setups.items():
            rates[k].append(step_rate(forward, x, y, opt, k[0] == "bf16", steps))
    return {label(*k): statistics.median(v) for k, v in rates.items()}, first_call


def bench_loaders(rounds: int, batch: int = 256, batches: int = 60) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (50_000, 32, 32, 3), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (50_000,), generator=g)
    mean, std = (125.3, 123.0, 113.9), (63.0, 62.1, 66.7)
    dev = DeviceLoader(x, y, batch, mean=mean, std=std, translate=2, flip="random", channels_last=True)
    host = make_dataloader(TensorPairs(x, y), batch, transform=RandomCropFlip(mean, std, pad=2, mode="reflect"))

    def rate(loader, epoch):
        it = loader.iter_epoch(epoch) if hasattr(loader, "iter_epoch") else iter(loader)
        next(it)   # start-up (worker processes) is not counted
        t0 = time.perf_counter()
        for _ in range(batches):
            next(it)
        return batches * batch / (time.perf_counter() - t0)

    out = {"device_loader": [], "dataloader": []}
    for r in range(rounds):
        out["device_loader"].append(rate(dev, r))
        out["dataloader"].append(rate(host, r))
    return {k: statistics.median(v) for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="add channels-last columns under torch.compile")
    ap.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    ap.add_argument("--name", default="vision_systems", help="results file name (one per machine you keep)")
    args = ap.parse_args()
    cols = configs(args.precisions, args.compile)
    if args.compile:   # a fresh on-disk cache, so first calls are cold whatever ran before
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="hasten-inductor-")
    results = {"steps": {}, "first_call_s": {}, "loaders": None}
    lines = ["# Conv-net systems choices on this machine", "",
             "Training steps of the speedrun net, batch 256, images/s (median over interleaved rounds):", "",
             "| widths | " + " | ".join(f"{p} {'channels-last' if cl else 'NCHW'}{' compiled' if c else ''}"
                                     for p, cl, c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for widths in [(64, 256, 256), (16, 48, 48)]:
        r, first = bench_steps(widths, args.rounds, cols)
        results["steps"][str(list(widths))] = r
        results["first_call_s"][str(list(widths))] = first
        base = r[f"{args.precisions[0]}/nchw"]
        lines.append(f"| {list(widths)} | " + " | ".join(f"{v:.0f} ({v / base:.2f}x)" for v in r.values()) + " |")
    if args.compile:
        lines += ["", "First call of each compiled column (tracing and code generation, cold cache), seconds:", "",
                  "| widths | " + " | ".join(results["first_call_s"][str(list((64, 256, 256)))]) + " |",
                  "|---|" + "---:|" * sum(c for *_, c in cols)]
        for w, first in results["first_call_s"].items():
            lines.append(f"| {w} | " + " | ".join(f"{v:.1f}" for v in first.values()) + " |")
    loaders = bench_loaders(args.rounds)
    results["loaders"] = loaders
    lines += ["", "Data loading alone, CIFAR-shaped uint8 images, batch 256, translate/crop 2 + flip, images/s:", "",
              "| loader | images/s |", "|---|---:|",
              f"| DeviceLoader (channels-last) | {loaders['device_loader']:.0f} |",
              f"| DataLoader, workers, per-sample crop + flip | {loaders['dataloader']:.0f} |",
              "", f"DeviceLoader / DataLoader: {loaders['device_loader'] / loaders['dataloader']:.2f}x"]
    j, m = write_results(args.name, results, "\n".join(lines))
    print(m.read_text())


if __name__ == "__main__":
    main()
