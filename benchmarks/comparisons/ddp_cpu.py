"""Data-parallel training on one CPU machine: one process using every core's thread against
one process per core with one thread each (DDP over gloo), on the same recipe and global batch.

On a 2-core machine this measures what data parallelism costs (the gradient all-reduce, the
per-step stop vote, a second Python interpreter), not scaling: the cores are the same. Each
comparison is a `hasten bench RECIPE --nproc 1,N` (runs interleaved, seeds paired, misses
censored; it continues where it stopped), and this script gathers the two into one table:
throughput (samples per second of timed training) and time to the single-process runs'
worst final loss.

    python -m benchmarks.comparisons.ddp_cpu --data cifar10-jpeg.zip --seeds 3 --name xeon-amx

Writes the table as a result of its own (benchmarks/results/distributed/<date>-<machine>-ddp_cpu-NAME/,
its report in docs/results/distributed/); each bench keeps its runs in a result folder of its own.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.tools.common import machine, result_folder, write_results  # noqa: E402

COMPARISONS = {
    # recipe -> overrides that make it a short proxy
    "shakespeare-char-baseline": [],
    "cifar10-narrow": ["trainer.max_duration=10ep", "trainer.eval_interval=5ep", "schedule.warmup=1ep"],
}


def bench(recipe: str, overrides: list[str], nproc: int, seeds: int, name: str) -> Path:
    folder = result_folder(f"ddp-cpu-{recipe}-{name}", "distributed")
    cmd = ["hasten", "bench", recipe, *overrides, "--nproc", f"1,{nproc}", "--target", "val/loss<=@first-worst",
           "--seeds", str(seeds), "--out", os.path.relpath(folder.parent), "--name", folder.name,   # relative: reports quote it
           "--title", f"{recipe}: 1 process x {nproc} threads against {nproc} processes x 1 thread"]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return folder / "report.json"


def row(recipe: str, label: str, r: dict) -> dict:
    timed, samples = r["timed_duration_s"]["mean"], r["samples"]["mean"]
    sp = r.get("speedup_time_to_target") or {}
    return {"recipe": recipe, "run": label, "runs": r["runs"], "reached": r["reached"],
            "samples_per_s": samples / timed if timed else None, "timed_s": timed,
            "km_median_to_target_s": r.get("median_time_to_target_s"),
            "speedup_to_target": sp.get("ratio"), "low": sp.get("low"), "high": sp.get("high"),
            "final_loss": r["final_metric"]["mean"], "final_loss_std": r["final_metric"]["std"],
            "p_vs_one_process": (r.get("metric_welch_vs_first") or {}).get("p"),
            "peak_mb_rank0": r["peak_memory_mb"]["mean"]}


def markdown(rows: list[dict], command: str, nproc: int, info: dict) -> str:
    lines = [f"# Data-parallel on one CPU machine: 1 process x {nproc} threads vs {nproc} processes x 1 thread", "",
             f"Command: `{command}`", "",
             "Same recipe, same global batch; time to the one-process runs' worst final validation loss "
             "(Kaplan-Meier medians, 95% bootstrap interval); throughput is samples per second of timed training.",
             "", "| recipe | processes x threads | reached | samples/s | time to target (KM median, s) | "
             "speedup [95% CI] | final val/loss | p | peak MB (rank 0) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shape = f"{nproc} x 1" if r["run"].endswith(f"x{nproc}proc") else f"1 x {nproc}"
        high = "open" if r["high"] is None else f"{r['high']:.2f}"
        ci = (f"{r['speedup_to_target']:.2f}x [{r['low']:.2f}, {high}]"
              if r["speedup_to_target"] is not None and r["low"] is not None else "-")
        med = f"{r['km_median_to_target_s']:.1f}" if r["km_median_to_target_s"] is not None else "not reached"
        p = f"{r['p_vs_one_process']:.2f}" if r["p_vs_one_process"] is not None else "-"
        lines.append(f"| {r['recipe']} | {shape} | {r['reached']}/{r['runs']} | {r['samples_per_s']:.0f} | {med} | {ci} | "
                     f"{r['final_loss']:.4f} ± {r['final_loss_std']:.4f} | {p} | {r['peak_mb_rank0']:.0f} |")
    lines += ["", f"Machine: {info['cpu']} ({', '.join(info['cpu_features']) or 'no AVX-512'}), {info['cores']} cores, "
              f"torch {info['torch']}", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="CIFAR-10 copy for cifar10-narrow (data.path); default: the data root")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=os.cpu_count() or 2, help="processes (default: the cores)")
    ap.add_argument("--name", default="local", help="suffix of the result files (name the machine)")
    ap.add_argument("--only", choices=sorted(COMPARISONS), help="run one recipe only")
    args = ap.parse_args()
    rows = []
    for recipe, overrides in COMPARISONS.items():
        if args.only and recipe != args.only:
            continue
        extra = overrides + ([f"data.path={args.data}"] if args.data and recipe.startswith("cifar") else [])
        report = json.loads(bench(recipe, extra, args.nproc, args.seeds, args.name).read_text())
        rows += [row(recipe, label, r) for label, r in report["recipes"].items()]
    info = machine()
    command = "python -m benchmarks.comparisons.ddp_cpu " + " ".join(sys.argv[1:])   # write_results records it too
    write_results(f"ddp_cpu-{args.name}", {"rows": rows},
                  markdown(rows, command, args.nproc, info))


if __name__ == "__main__":
    main()
