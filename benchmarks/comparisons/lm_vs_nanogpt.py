"""The language-model peer: nanoGPT's Tiny Shakespeare procedure against `shakespeare-char-baseline`
and `shakespeare-char-fast`, side by side, with each process's peak memory; and where hasten's
extra memory goes.

    python -m benchmarks.comparisons.lm_vs_nanogpt --seeds 3                # the side-by-side table
    python -m benchmarks.comparisons.lm_vs_nanogpt --memory                 # peak memory of hasten train, setting by setting
    python -m benchmarks.comparisons.lm_vs_nanogpt --memory --fast-parts    # what the fast recipe adds to the baseline's
    python -m benchmarks.comparisons.lm_vs_nanogpt --imports                # what importing TensorBoard's writer costs alone

Runs alternate (peer seed 0, baseline seed 0, fast seed 0, peer seed 1, ...), each its own
process: the peer is benchmarks/comparisons/peers/nanogpt_char.py (hasten's rendering of nanoGPT's train.py
with its CPU configuration), hasten's are `hasten train RECIPE` as a user runs them. Every final
model is scored with the same metric (the mean cross-entropy over every non-overlapping
64-character window of the held-out 10%: hasten's val/loss); time is the training iterations'
(evaluations excluded: nanoGPT's own periodic estimates and hasten's evaluations alike); peak
memory is the process's maximum resident set (getrusage of the child). `--allocator
default|hasten` runs hasten's commands with glibc's default malloc or with the settings
`hasten train` applies on a CPU by default (trainer.host_allocator=auto), and the peer with the
same (as MALLOC_* variables), so the memory goal can be read under either.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.tools.common import glibc_env, result_folder, hasten_malloc, mean_sd as _s, write_results  # noqa: E402

HERE = Path(__file__).parent
HASTEN_MALLOC = hasten_malloc()
WRAP = ("import json, resource, subprocess, sys\n"
        "rc = subprocess.run(sys.argv[1:]).returncode\n"
        "print('PEAK ' + json.dumps({'rc': rc, 'peak_rss_mb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))\n")


def measured(cmd: list[str], env: dict) -> dict:
    """Run `cmd` under a fresh wrapper process; its exit code, output and the peak RSS of the command."""
    r = subprocess.run([sys.executable, "-c", WRAP, *cmd], capture_output=True, text=True, env=env)
    peak = next((json.loads(ln[5:]) for ln in r.stdout.splitlines() if ln.startswith("PEAK ")), {"rc": r.returncode})
    return {**peak, "stdout": r.stdout, "stderr": r.stderr[-3000:]}


def hasten_run(recipe: str, seed: int, extra: list[str], env: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="lm-vs-") as tmp:
        run_dir = Path(tmp) / "run"
        m = measured([sys.executable, "-m", "hasten.cli", "train", recipe, f"trainer.seed={seed}",
                      f"trainer.run_dir={run_dir}", "--no-progress", *extra], env)
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()] if (run_dir / "metrics.jsonl").exists() else []
    vals = [r["val/loss"] for r in rows if "val/loss" in r]
    train_s = [r["time/train_seconds"] for r in rows if "time/train_seconds" in r]
    if m.get("rc") != 0 or not vals:
        raise SystemExit(f"{recipe} seed {seed} failed: {m['stderr'][-800:]}")
    return {"val_loss": vals[-1], "timed_s": train_s[-1] if train_s else None, "peak_rss_mb": m["peak_rss_mb"]}


def peer_run(seed: int, env: dict) -> dict:
    m = measured([sys.executable, "-m", "benchmarks.comparisons.peers.nanogpt_char", "--seed", str(seed)], env)
    line = next(ln for ln in m["stdout"].splitlines() if ln.startswith("{"))
    r = json.loads(line)
    return {"val_loss": r["val_loss"], "timed_s": r["timed_s"], "peak_rss_mb": m["peak_rss_mb"]}


def side_by_side(args) -> int:
    env = glibc_env()
    allocator = ["trainer.host_allocator=auto"] if args.allocator == "hasten" else ["trainer.host_allocator=default"]
    peer_env = {**env, **HASTEN_MALLOC} if args.allocator == "hasten" else env
    log = result_folder(args.name, "language-models") / "runs.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    done = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    have = {(r["arm"], r["seed"]) for r in done}
    for seed in range(args.seeds):
        for arm in ("nanoGPT (peer)", "shakespeare-char-baseline", "shakespeare-char-fast"):
            if (arm, seed) in have:
                continue
            r = peer_run(seed, peer_env) if arm.startswith("nanoGPT") else hasten_run(arm, seed, allocator, env)
            r.update(arm=arm, seed=seed, allocator=args.allocator)
            print(json.dumps(r), flush=True)
            with open(log, "a") as f:
                f.write(json.dumps(r) + "\n")
            done.append(r)
    rows, data = [], {}
    for arm in ("nanoGPT (peer)", "shakespeare-char-baseline", "shakespeare-char-fast"):
        rs = [r for r in done if r["arm"] == arm and r["seed"] < args.seeds]
        data[arm] = rs
        rows.append(f"| {arm} | {len(rs)} | {_s([r['val_loss'] for r in rs], 4)} | {_s([r['timed_s'] for r in rs], 1)} | "
                    f"{_s([r['peak_rss_mb'] for r in rs], 0)} |")
    md = (f"# The language-model peer: nanoGPT's procedure against hasten's recipes\n\n"
          f"Tiny Shakespeare, characters; runs alternating, each its own process; host allocator: {args.allocator} "
          "(hasten's commands and the peer alike). val loss: hasten's metric on every model (all non-overlapping "
          "64-character windows of the held-out 10%); training s: the training iterations, evaluations excluded; "
          "peak RSS: the process's maximum resident memory.\n\n"
          "| run | seeds | val loss (mean ± std) | training s | peak RSS MB |\n|---|---|---|---|---|\n"
          + "\n".join(rows) + "\n")
    _, m = write_results(args.name, {"runs": data, "allocator": args.allocator}, md)
    print(m.read_text())
    return 0


VARIANTS = {   # hasten train shakespeare-char-baseline, 300 steps, one setting at a time
    "as users run it (TensorBoard when installed, progress bar, allocator auto)": [],
    "no TensorBoard": ["trainer.tensorboard=false"],
    "glibc's default allocator": ["trainer.host_allocator=default"],
    "no progress bar": ["trainer.progress_bar=false"],
    "none of the three": ["trainer.tensorboard=false", "trainer.host_allocator=default", "trainer.progress_bar=false"],
}


FAST_PARTS = {   # (recipe, overrides): what shakespeare-char-fast changes, taken back one at a time
    "shakespeare-char-baseline as users run it": ("shakespeare-char-baseline", []),
    "shakespeare-char-fast as users run it": ("shakespeare-char-fast", []),
    "fast, AdamW instead of Muon": ("shakespeare-char-fast", ["optimizer.name=adamw", "optimizer.lr=1e-3",
                                                            "optimizer.muon=null"]),
    "fast, the baseline's batch (12 instead of 24)": ("shakespeare-char-fast", ["data.batch_size=12"]),
    "fast, the baseline's depth (4 layers instead of 2)": ("shakespeare-char-fast", ["model.n_layer=4"]),
}


def memory(args) -> int:
    env = glibc_env()
    rows, data = [], {}
    variants = FAST_PARTS if args.fast_parts else {k: (args.recipe, v) for k, v in VARIANTS.items()}
    for seed in range(args.seeds):   # seeds outermost: each variant's runs spread over the sitting
        for label, (recipe, extra) in variants.items():
            data.setdefault(label, []).append(hasten_run(recipe, seed, ["trainer.max_duration=300ba",
                                                                        "trainer.eval_interval=300ba", *extra],
                                                         env)["peak_rss_mb"])
    for label, (recipe, extra) in variants.items():
        shown = (f"`{recipe}` " if args.fast_parts else "") + f"`{' '.join(extra) or '-'}`"
        rows.append(f"| {label} | {shown} | {_s(data[label], 0)} |")
    if not args.fast_parts:
        peers = [peer_run(s, env)["peak_rss_mb"] for s in range(args.seeds)]
        rows.append(f"| nanoGPT (peer), the whole 2000 iterations | - | {_s(peers, 0)} |")
        data["peer"] = peers
    title = ("what `shakespeare-char-fast` adds to the baseline's, one change taken back at a time" if args.fast_parts
             else f"`hasten train {args.recipe}`, setting by setting")
    md = (f"# Peak memory: {title}\n\n"
          "300 steps (the peak is reached early: it is the imports and the first evaluation), each its own process; "
          "peak RSS as getrusage reports it for the child.\n\n| variant | overrides | peak RSS MB |\n|---|---|---|\n"
          + "\n".join(rows) + "\n")
    _, m = write_results(args.name + ("-memory-fast" if args.fast_parts else "-memory"), data, md)
    print(m.read_text())
    return 0


IMPORTS = {   # a fresh process each: peak RSS after these statements
    "import torch": "import torch",
    "import torch; from torch.utils.tensorboard import SummaryWriter":
        "import torch; from torch.utils.tensorboard import SummaryWriter",
    "the same, and a writer that logs 100 scalars":
        "import tempfile, torch; from torch.utils.tensorboard import SummaryWriter\n"
        "w = SummaryWriter(tempfile.mkdtemp())\nfor i in range(100): w.add_scalar('a', float(i), i)\nw.close()",
}


def imports(args) -> int:
    """Peak RSS of a process that only imports torch, against one that also imports (and uses)
    TensorBoard's writer: the cost of `trainer.tensorboard` apart from training."""
    env = glibc_env()
    data = {label: [] for label in IMPORTS}
    for _ in range(args.seeds):   # repeats, interleaved
        for label, code in IMPORTS.items():
            data[label].append(measured([sys.executable, "-c", code], env)["peak_rss_mb"])
    md = ("# Peak memory of importing TensorBoard's writer, apart from training\n\n"
          f"Each row a fresh process, {args.seeds} repeats interleaved; peak RSS as getrusage reports it.\n\n"
          "| process | peak RSS MB |\n|---|---|\n"
          + "\n".join(f"| `{label}` | {_s(v, 0)} |" if label.startswith("import") else f"| {label} | {_s(v, 0)} |"
                      for label, v in data.items()) + "\n")
    _, m = write_results(args.name + "-imports", data, md)
    print(m.read_text())
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--allocator", choices=("default", "hasten"), default="hasten")
    ap.add_argument("--memory", action="store_true", help="peak memory of hasten train, setting by setting")
    ap.add_argument("--recipe", default="shakespeare-char-baseline", help="--memory: the recipe")
    ap.add_argument("--fast-parts", action="store_true",
                    help="--memory: the fast recipe against the baseline, each of its changes taken back in turn")
    ap.add_argument("--name", default="lm-vs-nanogpt")
    ap.add_argument("--imports", action="store_true", help="peak memory of importing TensorBoard's writer alone")
    args = ap.parse_args(argv)
    if args.imports:
        return imports(args)
    return memory(args) if args.memory else side_by_side(args)


if __name__ == "__main__":
    sys.exit(main())
