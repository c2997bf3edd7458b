"""The compression figures of docs/compression.md: `hasten compress` applied to trained runs
(one per seed), each variant evaluated before and after, and its CPU inference measured
against the uncompressed model in the same process, interleaved.

    python -m benchmarks.comparisons.compress_figures --name prune50 --runs runs/c10fast-s0 runs/c10fast-s1 runs/c10fast-s2 \
        --prune 0.5 --finetune 1ep [--structured 0.3 [--multiple-of 16]] [--quantize int8] [--finetune-lr 0.1] \
        [--latency-runs 1] [-- KEY=VALUE ...]

Recipe overrides (e.g. trainer.precision=fp32, the fine-tune's precision) go after `--`, since
--runs takes every name that follows it.

Writes benchmarks/results/compress-NAME.json (every run's full report) and .md (the table:
quality before and after per seed, inference speedup at each batch with the faster of eager
and compiled on both sides, the CPU and the commit). Artifacts go to --work (not committed).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def speedup_cell(fastest: dict, reference: str, batch: int) -> tuple[float | None, str]:
    """(ratio, table cell) of the compressed model against `reference` at `batch`, each on its
    faster path; (None, "-") where either was not measured."""
    fb, fa = fastest.get((reference, batch)), fastest.get(("after", batch))
    if not (fb and fa):
        return None, "-"
    ratio = fb["median_s"] / fa["median_s"]
    return ratio, f"{ratio:.2f}x ({fb['path']} {fb['per_item_ms']:.3f} -> {fa['path']} {fa['per_item_ms']:.3f} ms/item)"


def finetune_cell(report: dict) -> str:
    """The fine-tune's precision and seconds ('fp32' for reports before they were recorded:
    fine-tuning ran in fp32 then); '-' without a fine-tune."""
    if not report["compression"].get("finetune"):
        return "-"
    ft = report.get("finetune")
    return f"{ft['precision']}, {ft['seconds']:.1f} s" if ft else "fp32"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True)
    p.add_argument("--runs", nargs="+", required=True, help="run folders of hasten train, one per seed")
    p.add_argument("--prune", type=float, default=0.0)
    p.add_argument("--scope", default="global")
    p.add_argument("--structured", type=float, default=0.0)
    p.add_argument("--multiple-of", type=int, help="--structured's kept counts (hasten compress --multiple-of)")
    p.add_argument("--quantize")
    p.add_argument("--finetune")
    p.add_argument("--finetune-lr", type=float, default=0.1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-latency", action="store_true", help="quality and bytes only")
    p.add_argument("--latency-runs", type=int, metavar="N",
                   help="measure inference on the first N runs only (seeds of one recipe compress to models of "
                        "one shape, so their times differ only by the machine's noise); default: every run")
    p.add_argument("--work", default="runs/compress-bench")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    for run in args.runs:
        if not Path(run).is_dir():
            p.error(f"--runs {run}: not a run folder (recipe overrides go after --)")
    from hasten.compress.measure import best
    from hasten.compress.pipeline import BF16_REFERENCE, compress_run
    from hasten.provenance import code_version, describe
    reports = []
    for i, run in enumerate(args.runs):
        print(f"== {run}", flush=True)
        latency = not args.no_latency and (args.latency_runs is None or i < args.latency_runs)
        r = compress_run(run, prune=args.prune, scope=args.scope, structured_ratio=args.structured, quant=args.quantize,
                         finetune_for=args.finetune, lr_factor=args.finetune_lr, overrides=args.overrides,
                         out=Path(args.work) / args.name / f"{Path(run).name}.hasten", repeats=args.repeats,
                         latency=latency, multiple_of=args.multiple_of)
        reports.append(r.report)
    metric, better = reports[0]["metric"], reports[0]["better"]
    cmd = "python -m benchmarks.comparisons.compress_figures " + " ".join(a for a in sys.argv[1:])
    lines = [f"# Compression figure: {args.name}", "", f"```bash\n{cmd}\n```", "",
             f"Steps: {'; '.join(reports[0]['compression']['steps'])}.", "",
             f"CPU: {reports[0]['cpu']['name']} (int8 hardware: {reports[0]['cpu']['int8_hardware']}), "
             f"{reports[0]['threads']} threads, torch {reports[0]['torch']}; code: {describe(code_version())}.", ""]
    batches = sorted({x["batch"] for x in reports[0].get("inference", []) if "median_s" in x})
    head = f"| run | {metric} before | after | change | " + "".join(f"speedup at batch {b} | " for b in batches) \
        + "bytes dense -> artifact | fine-tune | whole command s |"
    lines += [head, "|" + "---|" * (7 + len(batches))]
    diffs, speed = [], {b: [] for b in batches}
    for run, r in zip(args.runs, reports):
        b0, a0 = r["before"][metric], r["after"][metric]
        d = a0 - b0
        diffs.append(d)
        fastest = best(r.get("inference", []))
        cells = []
        for b in batches:
            ratio, cell = speedup_cell(fastest, "before", b)
            if ratio is not None:
                speed[b].append(ratio)
            cells.append(cell)
        rel = f" ({100 * d / b0:+.2f}%)" if metric == "val/loss" else f" ({100 * d:+.2f} points)"
        lines.append(f"| {Path(run).name} | {b0:.4f} | {a0:.4f} | {d:+.4f}{rel} | " + "".join(c + " | " for c in cells)
                     + f"{r['bytes']['dense_fp32']:,} -> {r['bytes']['artifact']:,} | {finetune_cell(r)} | "
                     + f"{r['seconds']:.1f} |")
    sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    lines += ["", f"Change in {metric} over {len(diffs)} runs: mean {statistics.mean(diffs):+.4f} ± {sd:.4f} (sd), "
              f"worst {max(diffs) if better == 'min' else min(diffs):+.4f}."]
    for b in batches:
        if speed[b]:
            lines.append(f"Speedup at batch {b}: median {statistics.median(speed[b]):.2f}x, range "
                         f"{min(speed[b]):.2f}x-{max(speed[b]):.2f}x.")
    if any(x["model"] == BF16_REFERENCE for r in reports for x in r.get("inference", [])):
        # this CPU has bf16 hardware: the dense model under bf16 autocast is the other float path
        lines += ["", "Against the model before run under bf16 autocast (this CPU computes bf16 in hardware; timed only):",
                  "", "| run | " + "".join(f"batch {b}: bf16 -> after | " for b in batches), "|---|" + "---|" * len(batches)]
        for run, r in zip(args.runs, reports):
            fastest = best(r.get("inference", []))
            cells = [speedup_cell(fastest, BF16_REFERENCE, b)[1] for b in batches]
            lines.append(f"| {Path(run).name} | " + "".join(c + " | " for c in cells))
    md = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"compress-{args.name}.md").write_text(md)
    (out / f"compress-{args.name}.json").write_text(json.dumps({"command": cmd, "runs": args.runs, "reports": reports},
                                                               indent=1, default=str))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
