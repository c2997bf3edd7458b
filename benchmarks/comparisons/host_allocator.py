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

`--workload hf-gpt` and `hf-gpt-hasten` time the Hugging Face Trainer instead, on the GPT-2
of benchmarks/comparisons/vs_trainers.py (4 layers of width 256, batch 16 x 256 tokens of the prose
corpus, bf16 where the CPU has bf16 hardware): the plain `transformers.Trainer` with the fused
AdamW, and `HastenTrainer` with hasten's Muon; the median of the optimizer steps after the
first five (the HF Trainer's callbacks time them). What `HastenTrainer(host_allocator="auto")`
and `HastenCallback(host_allocator="auto")` set is the fourth mode.

    python -m benchmarks.comparisons.host_allocator [--rounds 5] [--steps 10] [--workload speedrun|hf-gpt|hf-gpt-hasten]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent

MODES = {
    "glibc defaults": {},
    "three settings": {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1),
                       "MALLOC_TOP_PAD_": str(256 * 2**20)},
}
MODES["hasten (four settings)"] = {**MODES["three settings"], "MALLOC_MMAP_MAX_": "0"}


def peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
    print(json.dumps({"step_s": statistics.median(times), "batch": batch, "bf16": bf16, "peak_rss_mb": peak_rss_mb()}))


def child_hf(steps: int, hasten_trainer: bool) -> None:
    import tempfile

    import transformers

    import vs_trainers as V
    train, _, vocab = V.gpt_data()
    model = V.gpt_model(vocab, 0)
    args = V.hf_arguments(tempfile.mkdtemp(prefix="hf-"), steps + 5, 0, fast=hasten_trainer)
    times = []

    class StepTimes(transformers.TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    data = V.RandomWindowSet(train, (steps + 5) * V.BATCH, 0)
    trainer = V.hf_trainer(model, args, data, [StepTimes()], hasten_trainer)
    trainer.train()
    print(json.dumps({"step_s": statistics.median(times[5:]), "batch": V.BATCH, "bf16": bool(args.bf16),
                      "peak_rss_mb": peak_rss_mb()}))


WORKLOADS = {"speedrun": "speedrun net (64/256/256), channels-last, batch {batch}",
             "hf-gpt": "the HF Trainer (fused AdamW) on vs_trainers.py's GPT-2, batch 16 x 256 tokens",
             "hf-gpt-hasten": "HastenTrainer with hasten's Muon on vs_trainers.py's GPT-2, batch 16 x 256 tokens"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="speedrun")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.workload == "speedrun":
            child(args.steps, args.batch)
        else:
            child_hf(args.steps, args.workload == "hf-gpt-hasten")
        return
    from benchmarks.tools.common import glibc_env, write_results
    base_env = glibc_env()
    results = {m: [] for m in MODES}
    rss = {m: [] for m in MODES}
    bf16 = None
    for r in range(args.rounds):
        order = list(MODES) if r % 2 == 0 else list(MODES)[::-1]
        for mode in order:
            out = subprocess.run([sys.executable, "-m", __spec__.name, "--child", "--steps", str(args.steps), "--batch", str(args.batch),
                                  "--workload", args.workload],
                                 env={**base_env, **MODES[mode]}, capture_output=True, text=True, check=True)
            rec = json.loads(out.stdout.strip().splitlines()[-1])
            bf16 = rec["bf16"]
            rss[mode].append(rec["peak_rss_mb"])
            results[mode].append(rec["batch"] / rec["step_s"])
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{m} {v[-1]:.1f} samples/s" for m, v in results.items()),
              flush=True)
    base = statistics.median(results["glibc defaults"])
    unit = "images/s" if args.workload == "speedrun" else "sequences/s"
    digits = 0 if args.workload == "speedrun" else 2
    rows = [f"| {m} | {statistics.median(v):.{digits}f} | {min(v):.{digits}f}-{max(v):.{digits}f} | "
            f"{statistics.median(v) / base:.3f} | {max(rss[m]):.0f} |" for m, v in results.items()]
    what = WORKLOADS[args.workload].format(batch=args.batch)
    md = (f"# Host allocator settings and a CPU training step: {args.workload}\n\n"
          f"{what[0].upper() + what[1:]}, {'bf16 autocast' if bf16 else 'fp32'}; "
          f"each mode in a fresh process, {args.rounds} interleaved rounds, median of {args.steps} steps a run.\n\n"
          f"| allocator | {unit} (median) | min-max | vs glibc defaults | peak RSS MB (largest run) |\n|---|---:|---|---:|---:|\n" + "\n".join(rows))
    name = "host_allocator" + ("" if args.workload == "speedrun" else f"-{args.workload}")
    write_results(name, {"samples_per_s": results, "peak_rss_mb": rss, "workload": args.workload, "batch": args.batch, "bf16": bf16,
                         "modes": MODES}, md)
    print(md)


if __name__ == "__main__":
    main()
