"""Turn run records into the comparison report: tables (markdown), JSON, plots.

Timing rules (docs/bench.md):
- time to target = training time at the first evaluation that meets the target, minus the
  measured warm-up (extra time of the first step: compilation, allocator warm-up), plus
  method set-up computed from data (counted as part of a method's cost);
- evaluations that only watch for the target are timed separately and never counted;
- data loading into memory is reported separately;
- runs that never reach the target, and runs stopped by --cap, are censored: they took at
  least their whole timed duration (hasten.bench.survival); reached/total is shown beside
  every time to target, and the speedup is the ratio of Kaplan-Meier median times with a
  bootstrap interval;
- only finished and capped runs are counted; failed runs are listed with their error,
  interrupted ones are left out (a continued comparison reruns both);
- the fixed-budget view compares final metric and timed training duration.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ..errors import HastenError
from ..files import atomic_write
from ..hardware import describe_cpu
from ..provenance import describe as describe_code
from .runner import COUNTED, bench_outputs, outcome
from .stats import MIN_RUNS, describe, no_interval_note, ratio_ci, welch_t_test
from .survival import censored_speedup, describe_speedup, km_median
from .target import Target


def latest_per_run(runs: list[dict]) -> list[dict]:
    by_key = {}
    for r in runs:
        by_key[(r["label"], r["seed"])] = r
    return list(by_key.values())


def _warmup(r: dict) -> float:
    return (r.get("final") or {}).get("warmup_s", 0.0)


def timed_duration(r: dict) -> float | None:
    """Timed training work of a whole run: training minus warm-up plus method set-up."""
    f = r.get("final")
    if not f:
        return None
    return f["train_s"] - f["warmup_s"] + f.get("method_setup_s", 0.0)


def final_metric(r: dict, metric: str) -> float | None:
    f = r.get("final")
    if f and metric in f["metrics"]:
        return f["metrics"][metric]
    evals = [e for e in r.get("evals", []) if metric in e["metrics"]]
    return evals[-1]["metrics"][metric] if evals else None


def time_to_target(r: dict, target: Target) -> dict | None:
    for e in r.get("evals", []):
        v = e["metrics"].get(target.metric)
        if v is not None and target.reached(v):
            return {"seconds": e["train_s"] - _warmup(r) + e.get("method_setup_s", 0.0),
                    "samples": e["sample"], "tokens": e["token"], "batch": e["batch"]}
    return None


def resolve_target(target: Target, runs: list[dict], first_label: str) -> Target:
    if not target.from_first:
        return target
    vals = [final_metric(r, target.metric) for r in runs if r["label"] == first_label and outcome(r) in COUNTED]
    vals = [v for v in vals if v is not None]
    if not vals:
        raise HastenError(f"cannot resolve {target}: no finished run of {first_label} "
                          f"reports {target.metric}; check the failed runs' logs, or give the target as a number")
    if target.rule == "worst":
        value = max(vals) if target.op == "<=" else min(vals)
    else:
        value = sum(vals) / len(vals)
    return Target(target.metric, target.op, value, True, target.rule)


def censored_times(rs: list[dict], target: Target) -> list[tuple[float, bool]]:
    """(seconds, reached) per run: the time to target, or the whole timed run when it
    missed or was capped (right-censored)."""
    out = []
    for r in rs:
        hit = time_to_target(r, target)
        if hit:
            out.append((hit["seconds"], True))
        else:
            t = censor_time(r)
            if t is not None:
                out.append((t, False))
    return out


def censor_time(r: dict) -> float | None:
    """How long a run that did not reach the target trained at least: its timed duration,
    or for a run stopped by --cap (no final record), the training time of its last
    evaluation or log point."""
    if timed_duration(r) is not None:
        return timed_duration(r)
    seen = [e["train_s"] + e.get("method_setup_s", 0.0) for e in r.get("evals", [])]
    prog = r.get("progress") or {}
    if "train_s" in prog:
        seen.append(prog["train_s"])
    return max(seen) - (prog.get("warmup_s") or 0.0) if seen else None


def analyse(runs: list[dict], labels: list[str], target: Target) -> dict:
    latest = latest_per_run(runs)
    runs = [r for r in latest if outcome(r) in COUNTED]
    target = resolve_target(target, runs, labels[0])
    out = {"target": str(target), "target_value": target.value, "metric": target.metric, "recipes": {},
           "failed": [{"label": r["label"], "seed": r["seed"], "error": r.get("error"), "log": r.get("log")}
                      for r in latest if outcome(r) == "failed"],
           "interrupted": [{"label": r["label"], "seed": r["seed"]} for r in latest if outcome(r) == "interrupted"],
           "every_run": [_run_row(r, target) for r in sorted(latest, key=lambda r: (labels.index(r["label"])
                                                                                   if r["label"] in labels else 99,
                                                                                   r["seed"]))]}
    per = {}
    for label in labels:
        rs = sorted((r for r in runs if r["label"] == label), key=lambda r: r["seed"])
        hits = [time_to_target(r, target) for r in rs]
        ttt = [h["seconds"] for h in hits if h]
        finals = [v for v in (final_metric(r, target.metric) for r in rs) if v is not None]
        timed = [t for t in (timed_duration(r) for r in rs) if t is not None]
        fin = [r["final"] for r in rs if r.get("final")]
        per[label] = {"ttt": ttt, "finals": finals, "timed": timed, "censored": censored_times(rs, target)}
        out["recipes"][label] = {
            "runs": len(rs), "reached": len(ttt), "statuses": [outcome(r) for r in rs], "seeds": [r["seed"] for r in rs],
            "time_to_target_s": describe(ttt),
            "samples_to_target": describe([h["samples"] for h in hits if h]),
            "final_metric": describe(finals), "timed_duration_s": describe(timed),
            "warmup_s": describe([f["warmup_s"] for f in fin]), "eval_s": describe([f["eval_s"] for f in fin]),
            "data_setup_s": describe([f["data_setup_s"] for f in fin]),
            "method_setup_s": describe([f.get("method_setup_s", 0.0) for f in fin]),
            "samples": describe([f["sample"] for f in fin]), "tokens": describe([f["token"] for f in fin]),
            "peak_memory_mb": describe([f["peak_memory_bytes"] / 2**20 for f in fin]),
        }
    base = per[labels[0]]
    for label in labels:
        rec, p = out["recipes"][label], per[label]
        rec["speedup_time_to_target"] = censored_speedup(base["censored"], p["censored"])
        rec["median_time_to_target_s"] = km_median(p["censored"])
        rec["speedup_timed_duration"] = ratio_ci(base["timed"], p["timed"]) if base["timed"] and p["timed"] else None
        rec["metric_welch_vs_first"] = welch_t_test(p["finals"], base["finals"])
    machines = {json.dumps(r["final"]["machine"], sort_keys=True) for r in runs if r.get("final")}
    out["machines"] = [json.loads(m) for m in sorted(machines)]
    codes = {json.dumps(r["final"].get("code"), sort_keys=True) for r in runs if r.get("final")}
    out["code"] = [json.loads(c) for c in sorted(codes)]
    return out


def _run_row(r: dict, target: Target) -> dict:
    """One run as the report lists it, whatever became of it."""
    counted = outcome(r) in COUNTED
    hit = time_to_target(r, target) if counted else None
    return {"label": r["label"], "seed": r["seed"], "status": outcome(r), "counted": counted,
            "time_to_target_s": hit["seconds"] if hit else None, "timed_s": timed_duration(r) if counted else None,
            "final": final_metric(r, target.metric) if counted else None,
            "commit": ((r.get("final") or {}).get("code") or {}).get("commit")}


def _f(x, digits=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def _ci(c):
    if not c or math.isnan(c["ratio"]):
        return "–"
    if math.isnan(c["low"]):
        return f"{c['ratio']:.3f}x" + no_interval_note(c.get("n") or (MIN_RUNS,))
    return f"{c['ratio']:.3f}x [{c['low']:.3f}, {c['high']:.3f}]"


def header(title: str, target, explanation: str, command: str | None = None) -> list[str]:
    """The opening lines of a report: title, target with how to read the tables, command."""
    lines = [f"# {title}", "", f"Target: `{target}`. {explanation}", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    return lines


def markdown(analysis: dict, title: str, command: str | None = None) -> str:
    m = analysis["metric"]
    lines = header(title, analysis["target"],
                   "Times in seconds of timed work (training minus one-off warm-up, plus method set-up; evaluations "
                   "and data loading excluded). A run that misses the target, or is capped, counts as censored at its "
                   "whole timed duration. Time-to-target speedups are versus the first row: the ratio of Kaplan-Meier "
                   "median times with a 95% percentile-bootstrap interval (open-ended where a median is not reached); "
                   "fixed-budget speedups: ratio of geometric means of timed durations with a 95% Welch t-interval on "
                   "log times. p: Welch's t-test on the final metric versus the first row.",
                   command)
    lines += ["## Time to target", "",
              "| recipe | reached | KM median | mean of reached | std | min | max | speedup [95% CI] |",
              "|---|---|---|---|---|---|---|---|"]
    for label, r in analysis["recipes"].items():
        t = r["time_to_target_s"]
        med = r.get("median_time_to_target_s")
        lines.append(f"| {label} | {r['reached']}/{r['runs']} | {_f(med, 1) if med is not None else 'not reached by half'} | "
                     f"{_f(t['mean'], 1)} | {_f(t['std'], 1)} | {_f(t['min'], 1)} | {_f(t['max'], 1)} | "
                     f"{describe_speedup(r['speedup_time_to_target'])} |")
    lines += ["", "## Fixed budget", "",
              f"| recipe | final {m} mean ± std (min–max) | p | timed s mean ± std | speedup [95% CI] "
              "| warm-up s | eval s | data set-up s | samples | tokens | peak MB |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in analysis["recipes"].items():
        fm, td = r["final_metric"], r["timed_duration_s"]
        p = r["metric_welch_vs_first"]["p"]
        lines.append(
            f"| {label} | {_f(fm['mean'], 4)} ± {_f(fm['std'], 4)} ({_f(fm['min'], 4)}–{_f(fm['max'], 4)}) | "
            f"{_f(p, 3)} | {_f(td['mean'], 1)} ± {_f(td['std'], 1)} | {_ci(r['speedup_timed_duration'])} | "
            f"{_f(r['warmup_s']['mean'], 2)} | {_f(r['eval_s']['mean'], 1)} | {_f(r['data_setup_s']['mean'], 1)} | "
            f"{_f(r['samples']['mean'], 0)} | {_f(r['tokens']['mean'], 0)} | {_f(r['peak_memory_mb']['mean'], 0)} |")
    if analysis.get("every_run"):
        fewest = min((r["runs"] for r in analysis["recipes"].values()), default=0)
        lines += ["", "## Every run", ""]
        if fewest < MIN_RUNS:
            lines += [f"Fewer than {MIN_RUNS} counted runs a side: the speedups above are point figures with no "
                      "interval; read the runs.", ""]
        lines += [f"| recipe | seed | status | time to target s | timed s | final {m} | commit |",
                  "|---|---|---|---|---|---|---|"]
        for r in analysis["every_run"]:
            reach = (_f(r["time_to_target_s"], 1) if r["time_to_target_s"] is not None
                     else "missed" if r["counted"] else "not counted")
            lines.append(f"| {r['label']} | {r['seed']} | {r['status']} | {reach} | {_f(r['timed_s'], 1)} | "
                         f"{_f(r['final'], 4)} | {(r['commit'] or '?')[:10]} |")
    if analysis.get("failed"):
        lines += ["", "## Failed runs (not counted; rerun when the comparison is continued)", "",
                  "| recipe | seed | error | log |", "|---|---|---|---|"]
        for f in analysis["failed"]:
            lines.append(f"| {f['label']} | {f['seed']} | {(f['error'] or '?').replace('|', '/')} | {f['log']} |")
    if analysis.get("interrupted"):
        lines += ["", "Interrupted, not counted (continue the comparison to rerun): "
                  + ", ".join(f"{i['label']} seed {i['seed']}" for i in analysis["interrupted"])]
    for code in analysis.get("code", []):
        lines += ["", f"Code: {describe_code(code)}"]
    described = []   # one line per machine; records that differ only in what the line leaves out share it
    for mach in analysis.get("machines", []):
        line = (f"Machine: {describe_cpu(mach.get('cpu'), mach.get('cpu_features'), mach.get('kernel_caps'))}"
                + f", {mach.get('cores')} cores, {mach.get('threads')} threads, "
                f"torch {mach.get('torch')}, hasten {mach.get('hasten')}"
                + (f", GPU {mach['cuda']}" if mach.get("cuda") else ""))
        if line not in described:
            described.append(line)
            lines += ["", line]
    return "\n".join(lines) + "\n"


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None without matplotlib (plots are optional)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def legend_label(label: str, width: int = 48) -> str:
    """A recipe label as a plot's legend shows it: a long spec (recipe+override+override...)
    broken before its '+' into lines of about `width` characters, so the legend keeps its size."""
    lines, line = [], ""
    for part in re.split(r"(?=\+)", label):
        if line and len(line) + len(part) > width:
            lines.append(line)
            line = ""
        line += part
    return "\n".join(lines + [line])


def plot(runs: list[dict], labels: list[str], analysis: dict, path: Path) -> Path | None:
    """Metric versus timed training per run, and the time/quality Pareto view."""
    plt = pyplot()
    if plt is None:
        return None
    metric, tv = analysis["metric"], analysis["target_value"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, label in enumerate(labels):
        c = colors[i % len(colors)]
        for j, r in enumerate(sorted((r for r in latest_per_run(runs) if r["label"] == label), key=lambda r: r["seed"])):
            pts = [(e["train_s"] - _warmup(r) + e.get("method_setup_s", 0.0), e["metrics"][metric])
                   for e in r.get("evals", []) if metric in e["metrics"]]
            if pts:
                ax1.plot(*zip(*pts), color=c, alpha=0.7, marker=".", label=legend_label(label) if j == 0 else None)
            td, fm = timed_duration(r), final_metric(r, metric)
            if td is not None and fm is not None:
                ax2.scatter(td, fm, color=c, alpha=0.5, s=18)
        rec = analysis["recipes"][label]
        if rec["timed_duration_s"]["n"]:
            ax2.errorbar(rec["timed_duration_s"]["mean"], rec["final_metric"]["mean"],
                         xerr=rec["timed_duration_s"]["std"], yerr=rec["final_metric"]["std"], color=c, marker="D",
                         markersize=8, capsize=3, label=legend_label(label))
    for ax in (ax1, ax2):
        if tv is not None:
            ax.axhline(tv, color="gray", ls="--", lw=1, label="target")
        ax.set_xlabel("timed training (s)")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    ax1.set_title("metric vs time, every run")
    ax2.set_title("time / quality (runs and mean ± std)")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    return path


def strict_json(x):
    """`x` with every NaN or infinity as null: report.json is strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: strict_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict_json(v) for v in x]
    return x


def write_report(runs: list[dict], labels: list[str], target: Target, out_dir: Path, title: str,
                 command: str | None = None) -> dict:
    analysis = analyse(runs, labels, target)
    analysis["command"] = command
    outputs = bench_outputs(out_dir)   # checked before the comparison ran (runner.check_earlier_runs)
    files = ("report.json", "report.md", "report.png")
    outputs.claim(files)
    text = json.dumps(strict_json(analysis), indent=2, allow_nan=False) + "\n"
    atomic_write(out_dir / "report.json", lambda f: f.write(text), binary=False)
    md = markdown(analysis, title, command)
    png = plot(runs, labels, analysis, out_dir / "report.png")
    if png:
        md += f"\n![metric versus time and the Pareto view]({png.name})\n"
    atomic_write(out_dir / "report.md", lambda f: f.write(md), binary=False)
    outputs.record(files)
    return analysis
