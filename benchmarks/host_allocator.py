"""Host allocator settings and the speedrun network's CPU training step, side by side.

Each measurement runs in a fresh process (glibc reads its malloc settings at start-up), in
three modes, interleaved round by round:

- `glibc defaults`: nothing set;
- `three settings`: mmap threshold 32 MiB, trim threshold 2 GiB, top pad 256 MiB
  (hasten's settings before mmap max was added);
- `hasten (four settings)`: the same plus mmap max 0, as `hasten.allocator` sets them.

The settings are given as glibc's MALLOC_* variables, so the child process uses nothing of
hasten but the model definition. Workload: the speedrun network (widths 64/256/256),
channels-last, batch 1024, SGD with Nesterov momentum, bf16 autocast where the CPU has bf16
hardware (fp32 elsewhere); the median time of the steps after two warm-up steps.

    python benchmarks/host_allocator.py [--rounds 5] [--steps 10]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

MODES = {
    "glibc defaults": {},
    "three settings": {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1),
                       "MALLOC_TOP_PAD_": str(256 * 2**20)},
}
MODES["hasten (four settings)"] = {**MODES["three settings"], "MALLOC_MMAP_MAX_": "0"}


def child(steps: int, batch: int) -> None:
    import torch
    import torch.nn.functional as F

    from hasten.models import SpeedrunNet
    from hasten.hardware import cpu_has_bf16
    bf16 = cpu_has_bf16()
    torch.manual_seed(0)
    model = SpeedrunNet(widths=(64, 256, 256)).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    x = torch.randn(batch, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"step_s": statistics.median(times), "bf16": bf16}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.steps, args.batch)
        return
    from common import write_results
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    results = {m: [] for m in MODES}
    bf16 = None
    for r in range(args.rounds):
        order = list(MODES) if r % 2 == 0 else list(MODES)[::-1]
        for mode in order:
            out = subprocess.run([sys.executable, __file__, "--child", "--steps", str(args.steps), "--batch", str(args.batch)],
                                 env={**base_env, **MODES[mode]}, capture_output=True, text=True, check=True)
            rec = json.loads(out.stdout.strip().splitlines()[-1])
            bf16 = rec["bf16"]
            results[mode].append(args.batch / rec["step_s"])
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{m} {v[-1]:.0f} img/s" for m, v in results.items()), flush=True)
    base = statistics.median(results["glibc defaults"])
    rows = [f"| {m} | {statistics.median(v):.0f} | {min(v):.0f}-{max(v):.0f} | {statistics.median(v) / base:.3f} |"
            for m, v in results.items()]
    md = ("# Host allocator settings and the speedrun network's training step\n\n"
          f"Speedrun net (64/256/256), channels-last, batch {args.batch}, {'bf16 autocast' if bf16 else 'fp32'}; "
          f"each mode in a fresh process, {args.rounds} interleaved rounds, median of {args.steps} steps a run.\n\n"
          "| allocator | images/s (median) | min-max | vs glibc defaults |\n|---|---:|---|---:|\n" + "\n".join(rows))
    write_results("host_allocator", {"images_per_s": results, "batch": args.batch, "bf16": bf16,
                                     "modes": MODES}, md)
    print(md)


if __name__ == "__main__":
    main()
