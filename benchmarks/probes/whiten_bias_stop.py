"""What a training step costs while the whitening bias trains and after it stops, by how it stops.

`patch_whitening` trains the whitened stem's bias for the first epochs only. After that the
bias can stop in two ways: `requires_grad_(False)` (the backward pass ends at the first conv
group: no gradient for its conv's input, for the stem's activation or for the bias), or by
dropping the bias's gradient after each backward pass (the graph keeps its shape, as a
compiled or DDP-wrapped model needs, but the backward work is all still done). hasten takes the
first in an eager single-process run and the second otherwise; this measures the difference.

The speedrun net at the `cifar10-fast` widths, channels-last, batch 2000 as in the recipe: a
full training step (forward, backward, SGD) per setting and image size, settings interleaved
round by round; the table gives the median step time.

    python -m benchmarks.probes.whiten_bias_stop [--sizes 24 28 32] [--batch 2000] [--rounds 5]
                                          [--precision bf16|fp32] [--name whiten_bias_stop]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks.tools.common import write_results
from hasten.allocator import tune_host_allocator
from hasten.models import SpeedrunNet

SETTINGS = ("bias trains", "grad dropped", "requires_grad off")


def step_time(model, opt, x, y, bf16: bool, setting: str, steps: int) -> float:
    bias = model.whiten.bias
    bias.requires_grad_(setting != "requires_grad off")
    t0 = time.perf_counter()
    for _ in range(steps):
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y, label_smoothing=0.2)
        loss.backward()
        if setting == "grad dropped":
            bias.grad = None
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - t0) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[24, 28, 32])
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=2, help="steps per setting and size per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    ap.add_argument("--name", default="whiten_bias_stop", help="results file name (one per machine you keep)")
    args = ap.parse_args()
    tune_host_allocator()   # what the Trainer does on the CPU
    torch.manual_seed(0)
    model = SpeedrunNet(widths=(64, 256, 256), logit_scale=1 / 256).to(memory_format=torch.channels_last)
    model.whiten.weight.requires_grad_(False)   # frozen filters, as patch_whitening leaves them
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, nesterov=True)
    bf16 = args.precision == "bf16"
    data = {s: (torch.randn(args.batch, 3, s, s).contiguous(memory_format=torch.channels_last),
                torch.randint(0, 10, (args.batch,))) for s in args.sizes}
    for s in args.sizes:   # warm-up: one-off allocations and kernel choices
        for setting in SETTINGS:
            step_time(model, opt, *data[s], bf16, setting, 1)
    times = {(s, k): [] for s in args.sizes for k in SETTINGS}
    for r in range(args.rounds):
        for s in args.sizes:
            for k in (SETTINGS if r % 2 == 0 else SETTINGS[::-1]):
                times[s, k].append(step_time(model, opt, *data[s], bf16, k, args.steps))
    med = {key: statistics.median(v) for key, v in times.items()}
    lines = ["# Step cost while the whitening bias trains, and after it stops", "",
             f"Speedrun net (widths 64/256/256, channels-last), {args.precision}, batch {args.batch}: forward + "
             f"backward + SGD, median over {args.rounds} interleaved rounds of {args.steps} steps.", "",
             "| size px | bias trains s | grad dropped s | requires_grad off s | off vs dropped |",
             "|---:|---:|---:|---:|---:|"]
    for s in args.sizes:
        a, b, c = (med[s, k] for k in SETTINGS)
        lines.append(f"| {s} | {a:.3f} | {b:.3f} | {c:.3f} | {c / b:.2f} |")
    j, m = write_results(args.name, {"precision": args.precision, "batch": args.batch, "rounds": args.rounds,
                                     "steps": args.steps,
                                     "step_s": {f"{s}px": {k: med[s, k] for k in SETTINGS} for s in args.sizes},
                                     "samples_s": {f"{s}px": {k: times[s, k] for k in SETTINGS} for s in args.sizes}},
                         "\n".join(lines))
    print(m.read_text())


if __name__ == "__main__":
    main()
