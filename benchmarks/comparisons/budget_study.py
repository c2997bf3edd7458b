"""Train large, then compress: the budget study of docs/compression.md.

Two findings of "Train Large, Then Compress" (Li et al., 2020) tested on hasten's own tools:
(1) under one wall-clock training budget, larger Transformers reach a given validation loss
sooner than small ones; (2) larger models lose less to pruning and quantization, so at one
inference budget a large model trained briefly and then compressed can beat a small one.

    python -m benchmarks.comparisons.budget_study train    [--budget 300s] [--seeds 0 1 2] [--work runs/budget-study]
    python -m benchmarks.comparisons.budget_study compress [--work runs/budget-study]
    python -m benchmarks.comparisons.budget_study report   [--work runs/budget-study] [--name budget-study]

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

ROOT = Path(__file__).resolve().parents[2]

RECIPE = "shakespeare-char-fast"
# name: (width, heads, layers); the small one is shakespeare-char-fast itself
SIZES = {"S": (128, 4, 2), "M": (256, 4, 4), "L": (384, 6, 6)}
FINETUNE = "50ba"
# name: (structured ratio, unstructured sparsity, int8, fine-tune, measure latency on seed 0);
# u: global magnitude pruning (one threshold for all matrices), lu: per layer (each matrix
# pruned to the sparsity), added once the global variants showed what Muon's per-matrix
# scales do to one global threshold (docs/compression.md)
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
    "lu50": (0.0, 0.5, False, False, False),
    "lu50+ft": (0.0, 0.5, False, True, False),
    "lu70+ft": (0.0, 0.7, False, True, False),
    "lu50+ft+int8": (0.0, 0.5, True, True, False),
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
                r = subprocess.run([sys.executable, "-m", "hasten.cli", *cmd], env=env, stdout=f,
                                   stderr=subprocess.STDOUT)
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


def trained_runs(work: Path, args) -> list[tuple[str, int, Path]]:
    return [(size, seed, work / run_name(size, seed)) for seed in args.seeds for size in args.sizes
            if (work / run_name(size, seed) / "done.json").is_file()]


def compress(args) -> None:
    from hasten.compress.pipeline import compress_run
    work = Path(args.work)
    first = min(args.seeds)
    # seed 0 of every size first, so that a stopped study has every size's latencies
    for size, seed, run in sorted(trained_runs(work, args), key=lambda t: (t[1] != first, t[1], t[0])):
        for name, (structured, prune, int8, ft, timed) in VARIANTS.items():
            out = work / "compressed" / run.name / f"{name}.hasten"
            if out.with_suffix(".json").is_file():
                continue
            print(f"== {run.name} {name}", flush=True)
            compress_run(run, prune=prune, scope="layer" if name.startswith("lu") else "global",
                         structured_ratio=structured, quant="int8" if int8 else None,
                         finetune_for=FINETUNE if ft else None, out=out, repeats=args.repeats,
                         latency=timed and seed == first, log=lambda m: print("  " + m, flush=True),
                         multiple_of=1)   # exact kept counts, as the study's published figures were measured


def _evals(run: Path) -> list[tuple[float, int, float]]:
    """(training seconds, step, val/loss) of every evaluation of a run, from its metrics.jsonl."""
    rows = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "val/loss" in r:   # the study's runs (at 47a747e) wrote the key as time/train_seconds
            t = r.get("time/train_seconds_at_eval", r.get("time/train_seconds"))
            rows.append((t, r["step"], r["val/loss"]))
    return rows


def _latency_shape(name: str) -> str:
    """The measured variant whose inference cost a variant shares: zeros of unstructured pruning
    run on dense kernels, so only structured pruning and int8 change the cost."""
    s = "s30" in name
    q = "int8" in name
    return {(False, False): "u50", (True, False): "s30", (False, True): "int8", (True, True): "s30+ft+int8"}[(s, q)]


def collect(args) -> dict:
    from hasten.compress.measure import best
    work = Path(args.work)
    runs = trained_runs(work, args)
    training, variants, latency = {}, [], {}
    for size, seed, run in runs:
        done = json.loads((run / "done.json").read_text())
        training.setdefault(size, []).append({"seed": seed, "evals": _evals(run), "wall_s": done["wall_s"]})
        for name in ["dense", *VARIANTS]:
            f = work / "compressed" / run.name / f"{('u50' if name == 'dense' else name)}.json"
            if not f.is_file():
                continue
            r = json.loads(f.read_text())
            loss = r["before"]["val/loss"] if name == "dense" else r["after"]["val/loss"]
            nbytes = r["bytes"]["dense_fp32"] if name == "dense" else r["bytes"]["artifact"]
            variants.append({"size": size, "seed": seed, "variant": name, "val_loss": loss, "bytes": nbytes,
                             "parameters": r["parameters"]["after"] if name != "dense" else r["parameters"]["before"],
                             "nonzero": r["parameters"]["nonzero_after"] if name != "dense"
                             else r["parameters"]["nonzero_before"]})
            if r.get("inference"):
                fastest = best(r["inference"])
                for (model, batch), row in fastest.items():
                    if (model == "before") != (name == "dense"):   # the dense model's cost: u50's reference
                        continue
                    latency.setdefault(size, {}).setdefault(name, {})[batch] = {"ms": row["per_item_ms"],
                                                                                 "path": row["path"]}
    return {"training": training, "variants": variants, "latency": latency}


def _summary(data: dict) -> list[dict]:
    """One row per (size, variant): mean and spread of the loss over seeds, bytes, latency."""
    rows = {}
    for v in data["variants"]:
        rows.setdefault((v["size"], v["variant"]), []).append(v)
    out = []
    for (size, name), vs in rows.items():
        losses = [v["val_loss"] for v in vs]
        lat = data["latency"].get(size, {})
        src = "dense" if name == "dense" else _latency_shape(name)
        b1, b64 = (lat.get(src, {}).get(b) for b in (1, 64))
        out.append({"size": size, "variant": name, "seeds": len(vs), "val_loss": statistics.mean(losses),
                    "val_loss_sd": statistics.stdev(losses) if len(losses) > 1 else 0.0,
                    "val_loss_min": min(losses), "val_loss_max": max(losses),
                    "bytes": statistics.mean(v["bytes"] for v in vs), "parameters": vs[0]["parameters"],
                    "nonzero": statistics.mean(v["nonzero"] for v in vs),
                    "latency_source": src, "batch1_ms": b1 and b1["ms"], "batch1_path": b1 and b1["path"],
                    "batch64_ms_per_window": b64 and b64["ms"]})
    order = {s: i for i, s in enumerate(SIZES)}
    vorder = {n: i for i, n in enumerate(["dense", *VARIANTS])}
    return sorted(out, key=lambda r: (order[r["size"]], vorder[r["variant"]]))


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both (lower is better on both axes)."""
    keep = []
    for i, (x, y) in enumerate(points):
        if not any((x2 <= x and y2 <= y) and (x2 < x or y2 < y) for j, (x2, y2) in enumerate(points) if j != i):
            keep.append(i)
    return sorted(keep, key=lambda i: points[i][0])


def report(args) -> None:
    from benchmarks.tools.common import REPO, git_commit, machine, tree_dirty
    data = collect(args)
    rows = _summary(data)
    timed = [r for r in rows if r["batch1_ms"]]
    front = [timed[i] for i in pareto([(r["batch1_ms"], r["val_loss"]) for r in timed])]
    images = ROOT / "docs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    plots = _plots(data, rows, timed, front, images, args.name)
    lines = [f"# Budget study: train large, then compress ({args.name})", "",
             "Commands (from the repository root):", "",
             f"```bash\npython -m benchmarks.comparisons.budget_study train --budget {args.budget} --every {args.every}\n"
             "python -m benchmarks.comparisons.budget_study compress\n"
             f"python -m benchmarks.comparisons.budget_study report --name {args.name}\n```", ""]
    m = machine()
    lines += [f"Machine: {m['cpu']} ({', '.join(m.get('cpu_features', []))}), {m['cores']} cores, torch {m['torch']}; "
              f"report at commit {git_commit()}"
              f"{' (with uncommitted changes)' if tree_dirty(REPO) else ''}.", "", "## Training under one budget", "",
              "| size | width x layers | parameters | seeds | steps (mean) | val/loss at the end: mean ± sd (min-max) |",
              "|---|---|---|---|---|---|"]
    params = {r["size"]: r["parameters"] for r in rows if r["variant"] == "dense"}
    for size, runs in data["training"].items():
        finals = [r["evals"][-1][2] for r in runs]
        steps = statistics.mean(r["evals"][-1][1] for r in runs)
        d, _, l = SIZES[size]
        lines.append(f"| {size} | {d} x {l} | {params.get(size, 0):,} | {len(runs)} | {steps:.0f} | "
                     f"{statistics.mean(finals):.4f} ± {statistics.stdev(finals) if len(finals) > 1 else 0:.4f} "
                     f"({min(finals):.4f}-{max(finals):.4f}) |")
    lines += ["", "## Every variant", "",
              "Loss: mean over seeds (sd). Bytes: the artifact (dense: the fp32 state dict). Latency: batch 1, one "
              "64-character window, the faster of eager and compiled, measured on seed 0 of each size; unstructured "
              "zeros run on dense kernels, so a variant shares the latency of the measured variant of its shape "
              "(column 'timed as').", "",
              "| size | variant | seeds | val/loss | sd | change vs dense | bytes | non-zero parameters | batch 1 ms | "
              "timed as | batch 64 ms per window |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    dense = {r["size"]: r["val_loss"] for r in rows if r["variant"] == "dense"}
    for r in rows:
        ch = 100 * (r["val_loss"] / dense[r["size"]] - 1) if r["size"] in dense else float("nan")
        b1 = f"{r['batch1_ms']:.3f} ({r['batch1_path']})" if r["batch1_ms"] else "-"
        b64 = f"{r['batch64_ms_per_window']:.3f}" if r["batch64_ms_per_window"] else "-"
        lines.append(f"| {r['size']} | {r['variant']} | {r['seeds']} | {r['val_loss']:.4f} | {r['val_loss_sd']:.4f} | "
                     f"{ch:+.2f}% | {r['bytes']:,.0f} | {r['nonzero']:,.0f} | {b1} | {r['latency_source']} | {b64} |")
    lines += ["", "## Pareto front (val/loss against batch-1 latency)", "",
              "| size | variant | val/loss | batch 1 ms |", "|---|---|---|---|"]
    lines += [f"| {r['size']} | {r['variant']} | {r['val_loss']:.4f} | {r['batch1_ms']:.3f} |" for r in front]
    lines += ["", "Plots: " + ", ".join(f"`docs/images/{p.name}`" for p in plots), ""]
    md = "\n".join(lines) + "\n"
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.md").write_text(md)
    (out / f"{args.name}.json").write_text(json.dumps({"commit": git_commit(), "dirty": tree_dirty(REPO), "machine": m,
                                                       "sizes": SIZES, "variants": VARIANTS, "finetune": FINETUNE,
                                                       **data, "summary": rows, "pareto": front}, indent=1))
    print(md)


COLORS = {"S": "tab:blue", "M": "tab:orange", "L": "tab:red"}


def _marker(name: str) -> str:
    return "o" if name == "dense" else "s" if name.startswith("s30") else "^" if "int8" in name and name.startswith("int8") \
        else "v" if name.startswith("u") else "<" if name.startswith("lu") and "int8" not in name else "D"


def _plain_log_x(ax) -> None:
    """A log x axis labelled in plain numbers (0.6, 2, 5), not powers of ten."""
    from matplotlib.ticker import FuncFormatter
    ax.set_xscale("log")
    for axis in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
        axis(FuncFormatter(lambda v, _: f"{v:g}"))


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plots(data: dict, rows: list[dict], timed: list[dict], front: list[dict], images: Path, name: str) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    paths = []
    # 1. validation loss against training time, and against tokens (the mechanism)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for size, runs in data["training"].items():
        n = min(len(r["evals"]) for r in runs)
        t = np.array([[e[0] for e in r["evals"][:n]] for r in runs]).mean(0)
        tok = np.array([[e[1] * 24 * 64 for e in r["evals"][:n]] for r in runs]).mean(0)
        y = np.array([[e[2] for e in r["evals"][:n]] for r in runs])
        d, _, l = SIZES[size]
        label = f"{size}: width {d}, {l} layers ({len(runs)} seeds)"
        for ax, x in zip(axes, (t, tok)):
            ax.plot(x, y.mean(0), "-o", ms=3, color=COLORS[size], label=label)
            ax.fill_between(x, y.min(0), y.max(0), color=COLORS[size], alpha=0.2)
    axes[0].set_xlabel("training time (s, evaluations excluded)")
    axes[1].set_xlabel("training characters seen")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.set_ylabel("validation loss (nats/char)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("same wall-clock budget: loss against time")
    axes[1].set_title("the same runs against data seen")
    paths.append(_save(fig, images / f"{name}-training.png"))
    # 2. every variant: loss against bytes and against batch-1 latency
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    best = min(r["val_loss"] for r in rows)
    top = best + 0.6   # collapsed variants are drawn at the top edge, their loss written beside them
    for r in rows:
        c, mk = COLORS[r["size"]], _marker(r["variant"])
        y = min(r["val_loss"], top)
        for ax, x in ((axes[0], r["bytes"] / 1e6), (axes[1], r["batch1_ms"])):
            if not x:
                continue
            ax.errorbar(x, y, yerr=r["val_loss_sd"] if y < top else None, fmt=mk, color=c, ms=5, capsize=2,
                        mfc="none" if y >= top else c)
            if y >= top:
                ax.annotate(f"{r['val_loss']:.2f}", (x, y), fontsize=6, xytext=(0, -9), textcoords="offset points",
                            ha="center", color=c)
            elif r["variant"] in ("dense", "int8", "s30+ft", "lu50+ft", "s30+ft+int8"):
                ax.annotate(f"{r['size']} {r['variant']}", (x, y), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
    for ax in axes:
        _plain_log_x(ax)
        ax.set_ylim(best - 0.05, top + 0.05)
    axes[0].set_xlabel("bytes on disk (MB, log)")
    axes[1].set_xlabel("CPU latency, batch 1, one window (ms, log)")
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=COLORS[s], marker="o", ls="", label=f"size {s}") for s in COLORS] + \
        [Line2D([], [], color="gray", marker=m, ls="", label=l) for m, l in
         (("o", "dense"), ("v", "unstructured, global"), ("<", "unstructured, per layer"), ("s", "structured 30%"), ("^", "int8"), ("D", "pruned + int8"))]
    for ax in axes:
        ax.set_ylabel("validation loss")
        ax.grid(alpha=0.3)
    axes[1].legend(handles=handles, fontsize=7)
    axes[0].set_title("every variant: loss against size (hollow: off the scale)")
    axes[1].set_title("every variant: loss against latency")
    paths.append(_save(fig, images / f"{name}-variants.png"))
    # 3. the frontier: train small against train large, then compress
    if timed:
        fig, ax = plt.subplots(figsize=(6.8, 4.6))
        small = min(SIZES, key=lambda s: SIZES[s][0] * SIZES[s][2])
        for r in timed:
            group = "train small" if r["size"] == small else "train large, then compress"
            ax.plot(r["batch1_ms"], r["val_loss"], _marker(r["variant"]), color=COLORS[r["size"]],
                    mfc="none" if group == "train small" else COLORS[r["size"]], ms=6)
        ax.step([r["batch1_ms"] for r in front], [r["val_loss"] for r in front], where="post", color="k", lw=1,
                label="Pareto front")
        for r in front:
            ax.annotate(f"{r['size']} {r['variant']}", (r["batch1_ms"], r["val_loss"]), fontsize=7, xytext=(4, -8),
                        textcoords="offset points")
        ref = next((r for r in timed if r["size"] == small and r["variant"] == "dense"), None)
        if ref:
            ax.axhline(ref["val_loss"], color=COLORS[small], ls=":", lw=1, label=f"{small} dense loss")
            ax.axvline(ref["batch1_ms"], color=COLORS[small], ls="--", lw=1, label=f"{small} dense latency")
        from matplotlib.lines import Line2D
        _plain_log_x(ax)
        low = min(r["val_loss"] for r in timed)
        ax.set_ylim(low - 0.03, low + 0.45)   # collapsed variants lie above (see the variants plot)
        ax.set_xlabel("CPU latency, batch 1, one window (ms, log)")
        ax.set_ylabel("validation loss")
        ax.set_title("quality against inference latency (hollow: train small)")
        ax.grid(alpha=0.3)
        handles, _ = ax.get_legend_handles_labels()
        handles += [Line2D([], [], color=COLORS[s], marker="o", ls="", label=f"size {s}") for s in COLORS]
        ax.legend(handles=handles, fontsize=7)
        paths.append(_save(fig, images / f"{name}-frontier.png"))
    return paths


if __name__ == "__main__":
    sys.exit(main())
