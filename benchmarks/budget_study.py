"""Train large, then compress: the budget study of docs/compression.md.

Two findings of "Train Large, Then Compress" (Li et al., 2020) tested on hasten's own tools:
(1) under one wall-clock training budget, larger Transformers reach a given validation loss
sooner than small ones; (2) larger models lose less to pruning and quantization, so at one
inference budget a large model trained briefly and then compressed can beat a small one.

    python benchmarks/budget_study.py train    [--budget 300s] [--seeds 0 1 2] [--work runs/budget-study]
    python benchmarks/budget_study.py compress [--work runs/budget-study]
    python benchmarks/budget_study.py report   [--work runs/budget-study] [--name budget-study]

`train` runs `hasten train` (shakespeare-char-fast's settings: Muon, WSD schedule, QK-norm,
ReLU-squared, batch 24 x 64 characters) for each size and seed, interleaved (seed 0 of every
size first), with the same wall-clock training budget and an evaluation of the whole
validation text every --every seconds of training; each run folder keeps its checkpoint.
`compress` runs hasten compress (the library call behind the command) on every trained model
for every variant of VARIANTS; latency is measured on seed 0 of each size, once per model
shape (unstructured zeros run on dense kernels: their latency is the dense model's, measured
once to show it). `report` writes benchmarks/results/NAME.json and .md and the plots under
docs/images/. Every phase skips what a previous call finished, so a stopped study continues.
Run it alone on the machine: the budget is wall-clock.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

RECIPE = "shakespeare-char-fast"
# name: (width, heads, layers); the small one is shakespeare-char-fast itself
SIZES = {"S": (128, 4, 2), "M": (256, 4, 4), "L": (384, 6, 6)}
FINETUNE = "50ba"
# name: (structured ratio, unstructured sparsity, int8, fine-tune, measure latency on seed 0)
VARIANTS = {
    "u30": (0.0, 0.3, False, False, False),
    "u30+ft": (0.0, 0.3, False, True, False),
    "u50": (0.0, 0.5, False, False, True),
    "u50+ft": (0.0, 0.5, False, True, False),
    "u70": (0.0, 0.7, False, False, False),
    "u70+ft": (0.0, 0.7, False, True, False),
    "s30": (0.3, 0.0, False, False, True),
    "s30+ft": (0.3, 0.0, False, True, False),
    "int8": (0.0, 0.0, True, False, True),
    "u50+ft+int8": (0.0, 0.5, True, True, False),
    "s30+ft+int8": (0.3, 0.0, True, True, True),
    "s30+u50+ft+int8": (0.3, 0.5, True, True, False),
}


def run_name(size: str, seed: int) -> str:
    return f"{size}-s{seed}"


def train(args) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for seed in args.seeds:
        for size in args.sizes:
            d, n, l = SIZES[size]
            run = work / run_name(size, seed)
            if (run / "done.json").is_file():
                continue
            if run.exists():   # a run stopped part-way: its budget was spent under other conditions
                raise SystemExit(f"{run} exists without done.json (a stopped run): move it away and rerun")
            cmd = ["train", RECIPE, f"model.n_embd={d}", f"model.n_head={n}", f"model.n_layer={l}",
                   f"trainer.max_duration={args.budget}", f"trainer.eval_interval={args.every}",
                   f"trainer.seed={seed}", f"trainer.run_dir={run}", "--no-progress"]
            print(f"== {size} seed {seed}: hasten {' '.join(cmd)}", flush=True)
            t = time.perf_counter()
            log = work / f"{run_name(size, seed)}.log"
            with open(log, "w") as f:
                r = subprocess.run([sys.executable, "-c", "import sys; from hasten.cli import main; sys.exit(main())",
                                    *cmd], env=env, stdout=f, stderr=subprocess.STDOUT)
            if r.returncode != 0:
                raise SystemExit(f"{run} failed (exit {r.returncode}); see {log}")
            (run / "done.json").write_text(json.dumps({"command": "hasten " + " ".join(cmd), "size": size,
                                                        "seed": seed, "wall_s": time.perf_counter() - t}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("phase", choices=["train", "compress", "report"])
    p.add_argument("--work", default="runs/budget-study")
    p.add_argument("--budget", default="300s", help="wall-clock training budget of every run")
    p.add_argument("--every", default="30s", help="evaluation cadence in training seconds")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--name", default="budget-study")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    {"train": train, "compress": compress, "report": report}[args.phase](args)
    return 0


def compress(args) -> None:
    raise NotImplementedError


def report(args) -> None:
    raise NotImplementedError


if __name__ == "__main__":
    sys.exit(main())
