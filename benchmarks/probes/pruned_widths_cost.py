"""What a structured-pruned SpeedrunNet's widths cost on this CPU: exact counts against the
multiples of 16 that `hasten compress --structured` keeps by default (`--multiple-of`).

For each width triple: images a second of a whole training step (forward, backward, an SGD
update, channels-last; what `hasten compress --finetune` runs) and of an evaluation forward
pass (eval mode, no gradients), in fp32 and, where the CPU computes bf16 in hardware, under
bf16 autocast. Every (widths, precision, pass) setup is built and warmed up once, then the
rounds interleave all of them, so drift over the run favours none; the median of the rounds
is reported, with the range. Runs under hasten's host allocator settings, as `hasten train`
and `hasten compress` do on a CPU.

    python -m benchmarks.probes.pruned_widths_cost --name pruned_widths_cost-epyc-bf16
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.tools.common import write_results  # noqa: E402

WIDTHS = {"dense 64/256/256": (64, 256, 256), "30% exact 45/179/179": (45, 179, 179),
          "30% multiples of 16: 48/176/176": (48, 176, 176)}


def _setup(widths, precision: str, phase: str, batch: int):
    from hasten.models import SpeedrunNet
    torch.manual_seed(0)
    m = SpeedrunNet(widths=widths).to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))
    bf16 = precision == "bf16"
    if phase == "train":
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, nesterov=True)

        def run():
            with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        m.eval()

        @torch.no_grad()
        def run():
            with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                m(x)
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="calls timed together in each round")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--name", default="pruned_widths_cost")
    args = ap.parse_args()
    from hasten.allocator import tune_host_allocator
    from hasten.hardware import cpu_has_bf16
    tune_host_allocator()
    precisions = ["fp32"] + (["bf16"] if cpu_has_bf16() else [])
    setups = {}
    for label, widths in WIDTHS.items():
        for prec in precisions:
            for phase in ("train", "eval"):
                run = _setup(widths, prec, phase, args.batch)
                run(), run()   # warm-up: oneDNN picks and builds its kernels for these shapes
                setups[(label, prec, phase)] = run
    rates = {k: [] for k in setups}
    for r in range(args.rounds):
        for k, run in setups.items():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                run()
            rates[k].append(args.steps * args.batch / (time.perf_counter() - t0))
        print(f"round {r + 1}/{args.rounds}", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    lines = [f"# Training and evaluation throughput of pruned SpeedrunNet widths ({args.name})", "",
             f"Images a second, median of {args.rounds} interleaved rounds of {args.steps} calls at batch {args.batch} "
             "(range in brackets), channels-last, hasten's host allocator settings. Ratio: against the exact widths.", "",
             "| widths | precision | training step | vs exact | evaluation forward | vs exact |", "|---|---|---|---|---|---|"]
    exact = "30% exact 45/179/179"
    for label in WIDTHS:
        for prec in precisions:
            cells = []
            for phase in ("train", "eval"):
                v = rates[(label, prec, phase)]
                cells.append(f"{med[(label, prec, phase)]:.0f} [{min(v):.0f}-{max(v):.0f}]")
                cells.append(f"{med[(label, prec, phase)] / med[(exact, prec, phase)]:.2f}x")
            lines.append(f"| {label} | {prec} | " + " | ".join(cells) + " |")
    md = "\n".join(lines) + "\n"
    data = {"batch": args.batch, "rounds": args.rounds, "steps": args.steps,
            "rates": [{"widths": list(WIDTHS[k[0]]), "label": k[0], "precision": k[1], "phase": k[2],
                       "images_per_s": v, "median": med[k]} for k, v in rates.items()]}
    write_results(args.name, data, md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
