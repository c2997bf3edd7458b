"""What a training step costs at each image size, against what its FLOPs predict.

Progressive resizing saves what smaller images save on *this* machine, and kernels rarely
scale with pixel count: small spatial sizes and odd ones use the vector units less well.
For each size, a batch of 32 px images is resized the way `progressive_resizing` does it
(area for downscaling) and the speedrun net (the `cifar10-fast` widths, channels-last) takes
a full training step: resize, forward, backward, SGD. Sizes are interleaved round by round;
the table gives the median step time relative to 32 px next to the FLOPs ratio, and their
quotient: how much of the FLOP saving a size keeps (1.00 = all of it).

    python -m benchmarks.probes.resize_cost [--sizes 20 24 28 32] [--batch 500] [--rounds 5]
                                     [--precision fp32|bf16] [--name resize_cost]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks.tools.common import write_results
from hasten.algorithms.progressive_resizing import resize_batch
from hasten.allocator import tune_host_allocator
from hasten.models import SpeedrunNet
from hasten.models.flops import forward_flops


def step_time(model, opt, x, y, size: int, bf16: bool, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        xs = resize_batch(x, size / x.shape[-1], size_increment=1)
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(xs), y, label_smoothing=0.2)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - t0) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 24, 26, 28, 30, 32])
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--steps", type=int, default=2, help="steps per size per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--name", default="resize_cost", help="results file name (one per machine you keep)")
    args = ap.parse_args()
    full = max(args.sizes)
    tune_host_allocator()   # what the Trainer does on the CPU: buffers of every size stay on the heap
    torch.manual_seed(0)
    model = SpeedrunNet(widths=(64, 256, 256), logit_scale=1 / 256).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, nesterov=True)
    x = torch.randn(args.batch, 3, full, full).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (args.batch,))
    bf16 = args.precision == "bf16"
    flops = {s: forward_flops(model, resize_batch(x[:2], s / full, size_increment=1)) for s in args.sizes}
    for s in args.sizes:   # warm-up: one-off allocations and kernel choices
        step_time(model, opt, x, y, s, bf16, 1)
    times = {s: [] for s in args.sizes}
    for _ in range(args.rounds):
        for s in args.sizes:
            times[s].append(step_time(model, opt, x, y, s, bf16, args.steps))
    med = {s: statistics.median(v) for s, v in times.items()}
    rows = {s: {"step_s": med[s], "images_per_s": args.batch / med[s], "time_ratio": med[s] / med[full],
                "pixel_ratio": (s / full) ** 2, "flops_ratio": flops[s] / flops[full],
                "flops_kept": (1 - med[s] / med[full]) / (1 - flops[s] / flops[full]) if s != full else None}
            for s in args.sizes}
    lines = ["# Step cost by image size", "",
             f"Speedrun net (widths 64/256/256, channels-last), {args.precision}, batch {args.batch}: resize from "
             f"{full} px + forward + backward + SGD, median over {args.rounds} interleaved rounds of {args.steps} steps.",
             "'Saving kept': the share of the FLOP saving that shows up as time saved.", "",
             "| size px | step s | images/s | time vs full | FLOPs vs full | pixels vs full | saving kept |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for s, r in rows.items():
        kept = "–" if r["flops_kept"] is None else f"{r['flops_kept']:.2f}"
        lines.append(f"| {s} | {r['step_s']:.3f} | {r['images_per_s']:.0f} | {r['time_ratio']:.2f} | "
                     f"{r['flops_ratio']:.2f} | {r['pixel_ratio']:.2f} | {kept} |")
    j, m = write_results(args.name, {"precision": args.precision, "batch": args.batch, "rounds": args.rounds,
                                     "steps": args.steps, "sizes": {str(s): r for s, r in rows.items()}},
                         "\n".join(lines))
    print(m.read_text())


if __name__ == "__main__":
    main()
