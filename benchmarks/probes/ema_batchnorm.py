"""Why an EMA of the weights can make a short batch-norm run worse, and what fixes it.

The case reported: a small CNN with batch norm trained from scratch for 156 steps (one epoch
of CIFAR-10 at batch 320), SGD with a linear decay to zero, the device loader, channels-last
and label smoothing; adding EMA(decay=0.99, update_every=5) ended far below the same run
without it. Each seed trains once, the average kept beside the model, and evaluates the
trained weights, the average with its averaged batch-norm buffers, and the average with
batch-norm statistics recomputed for it.

    python -m benchmarks.probes.ema_batchnorm [--seeds 2] [--data .data/cifar10-jpeg.zip]
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings

import torch
from torch import nn

from benchmarks.tools.common import write_results  # noqa: E402

from hasten import Trainer, make_runtime  # noqa: E402
from hasten.algorithms import EMA, ChannelsLast, LabelSmoothing  # noqa: E402
from hasten.algorithms._averaging import recompute_batchnorm  # noqa: E402
from hasten.data import DeviceLoader  # noqa: E402
from hasten.data.cifar import MEAN, STD, load_cifar10  # noqa: E402
from hasten.optim import LRSchedule  # noqa: E402


def small_cnn() -> nn.Module:
    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.MaxPool2d(2))
    return nn.Sequential(block(3, 32), block(32, 64), block(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(128, 10))


def accuracy(model, loader, rt) -> float:
    model.eval()
    right = n = 0
    with torch.no_grad(), rt.autocast():
        for x, y in loader:
            right += (model(x).argmax(1) == y).sum().item()
            n += len(y)
    return right / n


def run(seed: int, data) -> dict:
    """One training run with EMA(decay=0.99, update_every=5) kept beside the model (final_swap
    off, so the model ends with the trained weights), then every candidate evaluated."""
    rt = make_runtime(device="cpu", precision="auto", seed=seed)
    common = dict(mean=MEAN, std=STD, device=rt.device, channels_last=True, seed=seed)
    train = DeviceLoader(data.train_x, data.train_y, 320, translate=2, flip="random", shuffle=True, drop_last=True,
                         **common)
    test = DeviceLoader(data.test_x, data.test_y, 1000, shuffle=False, **common)
    ema = EMA(decay=0.99, update_every=5, final_swap=False)
    short = EMA(decay=0.9, final_swap=False)   # a horizon of ~10 batches, for comparison
    tr = Trainer(small_cnn, train, max_duration="1ep", runtime=rt,
                 optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9, nesterov=True,
                                                      weight_decay=5e-4),
                 schedulers=[LRSchedule("linear", warmup="10ba")], algorithms=[ChannelsLast(), LabelSmoothing(0.1), ema, short])
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr.fit()
    out = {"seconds": time.perf_counter() - t0, "steps": tr.state.timestamp.batch,
           "trained": accuracy(tr.state.model, test, rt)}
    for name, average in (("ema", ema), ("short", short)):
        probe = copy.deepcopy(tr.state.model)
        tensors = [*probe.parameters(), *(b for b in probe.buffers() if b.is_floating_point())]
        with torch.no_grad():
            for t, e in zip(tensors, average.ema):
                t.copy_(e)
        out[f"{name}_averaged_stats"] = accuracy(probe, test, rt)
        state = tr.state
        trained, state.model = state.model, probe
        recompute_batchnorm(state, 20)
        state.model = trained
        out[f"{name}_recomputed_stats"] = accuracy(probe, test, rt)
    # what fit leaves now: the better of the average (statistics as EMA's bn_batches say) and the trained weights
    out["left_bn0"] = max(out["trained"], out["ema_averaged_stats"])
    out["left_bn20"] = max(out["trained"], out["ema_recomputed_stats"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--data", default=".data/cifar10-jpeg.zip")
    args = p.parse_args()
    data = load_cifar10(args.data)
    rows = []
    for seed in range(args.seeds):
        r = run(seed, data)
        r["seed"] = seed
        rows.append(r)
        print(r, flush=True)
    md = ["# EMA on a short batch-norm run (CIFAR-10 JPEG copy, 156 steps, small CNN)", "",
          "`python -m benchmarks.probes.ema_batchnorm`: one run per seed, EMA(decay=0.99, update_every=5) kept beside the "
          "model; accuracy on the 10,000 test images of the trained weights, of the average with batch-norm buffers "
          "averaged like the weights (what EMA put in place before, untested), of the average with statistics "
          "recomputed over 20 training batches (EMA(bn_batches=20)), and what fit leaves now (the better of the "
          "average and the trained weights); EMA(0.9) is a second average with a horizon of about 10 batches, kept in the same run.", "",
          "| seed | trained | EMA, averaged BN stats | EMA, recomputed BN stats | EMA(0.9), averaged | EMA(0.9), recomputed | left now (bn_batches 0) | left now (bn_batches 20) | s |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['seed']} | {r['trained']:.4f} | {r['ema_averaged_stats']:.4f} | {r['ema_recomputed_stats']:.4f} | "
                  f"{r['short_averaged_stats']:.4f} | {r['short_recomputed_stats']:.4f} | "
                  f"{r['left_bn0']:.4f} | {r['left_bn20']:.4f} | {r['seconds']:.0f} |")
    write_results("ema_batchnorm", {"rows": rows}, "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
