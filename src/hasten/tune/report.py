"""What `hasten tune` writes: the table, the one-line summary, the plot, tune.json and
tuned.yaml (the recipe as `base:` plus the winning overrides)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from ..files import atomic_write
from ..hardware import BF16_CPU_FLAGS, describe_caps
from ..outputs import Outputs
from ..provenance import describe
from .methods import render as methods_lines

REPORT_FILES = ("tune.json", "tune.md", "tune.png", "tuned.yaml")


def _tune_folder(folder: Path) -> bool:
    """A folder written by a tune from before the output index: its tune.json is a tune result."""
    try:
        data = json.loads((folder / "tune.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"recipe", "machine", "table", "tuned_overrides"} <= set(data)


def report_outputs(out: Path) -> Outputs:
    """The report files of a tune into `out`, under hasten's rule for output folders."""
    return Outputs(out, "hasten tune", legacy=_tune_folder)


def _fmt_tp(tp: dict | None) -> str:
    if not tp:
        return "-"
    return f"{tp['samples_per_s']:,.1f} [{tp['low']:,.1f}, {tp['high']:,.1f}]"


LOADER_HEAVY = 0.25   # the share of the cores a loader's workers may keep busy before the report points to it


def loader_lines(result: dict) -> list[str]:
    """One line when the chosen settings' loader workers kept a large share of the cores busy:
    per-sample work in the Dataset competes with the step, which its waiting time does not show."""
    cores = result["machine"].get("cores") or 1
    chosen = [r for r in result["table"] if r.get("chosen") and r.get("loader_cores") is not None]
    if not chosen or chosen[-1]["loader_cores"] < LOADER_HEAVY * cores:   # the last stage's: every choice made
        return []
    return ["", f"The loader's workers kept {chosen[-1]['loader_cores']:.2f} of the {cores} cores busy under the "
            "chosen settings: the Dataset's per-sample work (decoding, augmentation, seeding) takes those cores from "
            "the step. Batched augmentation on the step's side (data.loader=device for hasten's datasets), decoded "
            "samples kept in memory, or fewer step threads (the threads stage) give them back."]


def render(result: dict) -> str:
    m = result["machine"]
    lines = [f"# hasten tune: {result['recipe']}", "",
             f"Machine: {m['cpu']} ({', '.join(m['flags'])}){describe_caps(m.get('kernel_caps'))}, {m['cores']} cores"
             + (", bf16 capped off (oneDNN emulates it in this process)"
                if m.get("bf16_hardware") is False and BF16_CPU_FLAGS & set(m["flags"]) else "")
             + (f", {m['gpu']}" if m.get("gpu") else "") + f", torch {m['torch']}; measured {result['date']}, "
             f"{result['spent_s'] / 60:.1f} of {result['budget_s'] / 60:.0f} minutes."
             + (f" Code: {describe(result['code'])}." if result.get("code") else ""), "",
             "| stage | option | samples/s [95% interval] | waiting for data | loader workers, cores | "
             "first-step extra s | chosen | miss |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["table"]:
        extra = f"{r['first_step_extra_s']:.1f}" if r.get("first_step_extra_s") is not None else "-"
        wait = f"{100 * r['data_wait']:.0f}%" if r.get("data_wait") is not None else "-"
        workers = f"{r['loader_cores']:.2f}" if r.get("loader_cores") is not None else "-"
        lines.append(f"| {r['stage']} | {r['option']} | {_fmt_tp(r['throughput'])} | {wait} | {workers} | {extra} | "
                     f"{'**yes**' if r.get('chosen') else ''} | {r.get('miss') or ''} |")
    lines += ["", "Waiting for data: the share of a trial's training time its steps spent getting their batch (the "
              "loader is the bottleneck when it is large). Loader workers: the cores the loader's worker processes "
              "kept busy meanwhile, taken from the step's (a loader can keep up and still slow the step)."]
    lines += loader_lines(result)
    if result["skipped"]:
        lines += [""] + [f"- {s['stage']}: not searched: {s['why']}" for s in result["skipped"]]
    if result.get("shortened"):
        lines += [""] + [f"- {s['stage']}: measured in {s['why']}" for s in result["shortened"]]
    g = result["guard"]
    lines += ["", "Quality guard: " + (
        f"{'passed' if g['passed'] else 'FAILED (excluded)'} for {', '.join(g['options'])}: mean training loss over "
        f"the last half of {g['steps']} steps {g['tuned']:.4f} against the reference's {g['reference'][0]:.4f} and "
        f"{g['reference'][1]:.4f} (tolerance {g['tolerance']:.4f})" if g.get("checked") else f"not run: {g['why']}" + (
        f"; {', '.join(g['excluded'])} kept as the recipe has it (never handed over unchecked)" if g.get("excluded") else ""))]
    lines += explain_lines(result.get("why"))
    if result.get("spent_by"):
        lines += ["", "Where the minutes went: " + ", ".join(f"{k} {v / 60:.1f}" for k, v in result["spent_by"].items())
                  + f"; {result['spent_s'] / 60:.1f} in all, of a budget of {result['budget_s'] / 60:.0f}."]
    if result.get("methods"):
        lines += methods_lines(result["methods"])
    lines += ["", f"Tuned overrides: `{' '.join(result['tuned_overrides']) or '(none: the recipe as written)'}`", "",
              summary(result)]
    return "\n".join(lines) + "\n"


def explain_lines(why: dict | None) -> list[str]:
    """The report's lines on why each change won: per changed stage, the step time and the two
    phases that moved most, from the recipe's setting to the winner."""
    if not why:
        return []
    if not why.get("stages"):
        return ["", f"Why the winners won: {why.get('why', 'not profiled')}"]
    lines = ["", f"Why the winners won (a profiled window of {why['steps']} steps each, the recipe's setting "
                 "against the winner, the other chosen settings in both; ms a step):"]
    for st in why["stages"]:
        if st.get("miss"):
            lines.append(f"- {st['stage']}: {st['from']} -> {st['to']}: {st['miss']}")
            continue
        moved = sorted(((k, a, b) for k, (a, b) in st["ms"].items() if k != "other"),
                       key=lambda x: abs(x[2] - x[1]), reverse=True)[:2]
        (a, b) = st["step_ms"]
        lines.append(f"- {st['stage']}: {st['from']} -> {st['to']}: step {a:.1f} -> {b:.1f}; "
                     + ", ".join(f"{k} {x:.1f} -> {y:.1f}" for k, x, y in moved))
    return lines


def speedup(result: dict) -> "tuple[float, float, float] | None":
    """(ratio of the tuned recipe's median throughput to the recipe as written's, low, high): the
    interval from the two throughputs' 95% intervals."""
    t, w = result.get("tuned"), result.get("as_written")
    if not t or not w:
        return None
    return t["samples_per_s"] / w["samples_per_s"], t["low"] / w["high"], t["high"] / w["low"]


def noisy(result: dict) -> bool:
    """Too noisy to state a figure: the speed-up's interval is wider than the gain it would show
    (or than the least gain asked for), or trials had to be run again because the machine was busy."""
    s = speedup(result)
    if s is None:
        return False
    ratio, lo, hi = s
    return hi - lo > max(abs(ratio - 1), result.get("min_gain", 0.05)) or bool(result.get("busy"))


def summary(result: dict) -> str:
    if not result.get("speedup"):
        return "The tuned recipe could not be measured against the recipe as written."
    ratio, lo, hi = speedup(result) or (result["speedup"], None, None)
    gain = result.get("min_gain", 0.0)
    figure = f"{ratio:.2f}x [{lo:.2f}, {hi:.2f}]" if lo is not None else f"{ratio:.2f}x"
    busy = (f" (trials were run again while other processes held up to {max(result['busy']):.0%} of the cores)"
            if result.get("busy") else "")
    if result.get("searched_overrides") and not result["tuned_overrides"]:
        why = "; ".join(f"against the recipe as written in the {k}: {v}"
                        for k, v in (result.get("handover") or {}).get("why", {}).items())
        if noisy(result):
            return (f"Nothing beat the recipe as written by {gain:.0%} that the measurements could show: the machine "
                    f"was too noisy to decide (the search's best measured {figure} its throughput){busy}. tuned.yaml "
                    "is the recipe as written; rerun when the machine is idle, or with a larger --budget for more "
                    "rounds.")
        return (f"Nothing beat the recipe as written by {gain:.0%} on this machine: tuned.yaml is the recipe as "
                f"written (the search's best measured {figure} its throughput, {_fmt_tp(result.get('tuned'))} against "
                f"{_fmt_tp(result.get('as_written'))} samples/s" + (f"; {why}" if why else "") + ").")
    chosen = [v for k, v in result["decisions"].items() if "excluded" not in v]
    if not result["tuned_overrides"]:
        return "No setting was handed over: tuned.yaml is the recipe as written (what was skipped, and why, is above)."
    if noisy(result):
        return (f"{' + '.join(chosen)}: faster than the recipe as written in every check, but the machine was too "
                f"noisy to put a figure on it ({figure}){busy}; rerun when it is idle for one.")
    interval = f", interval [{lo:.2f}, {hi:.2f}]" if lo is not None else ""
    return (f"{' + '.join(chosen)}: {ratio:.2f}x the recipe's throughput on this machine{interval} "
            f"({_fmt_tp(result.get('tuned'))} against {_fmt_tp(result.get('as_written'))} samples/s).")


def plot(result: dict, path: Path) -> Path | None:
    try:
        import matplotlib   # optional extra: plot
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt   # optional extra: plot
    except ImportError:
        return None
    rows = [r for r in result["table"] if r["throughput"]]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.5))
    ys = range(len(rows))
    vals = [r["throughput"]["samples_per_s"] for r in rows]
    err = [[v - r["throughput"]["low"] for v, r in zip(vals, rows)], [r["throughput"]["high"] - v for v, r in zip(vals, rows)]]
    ax.barh(list(ys), vals, xerr=err, color=["tab:green" if r.get("chosen") else "tab:gray" for r in rows])
    ax.set_yticks(list(ys), [f"{r['stage']}: {r['option']}" for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("samples per second (95% interval)")
    ax.set_title(f"hasten tune {result['recipe']} on {result['machine']['cpu']}")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    return path


def write(result: dict, out: "Path | Outputs") -> None:
    """tune.json, tune.md, tune.png and tuned.yaml into the output folder; only files a tune
    wrote are replaced (`tune` checks before its search, a folder given here is checked now)."""
    if not isinstance(out, Outputs):
        outputs = report_outputs(Path(out))
        outputs.check(REPORT_FILES, "choose another folder, or move them away")
    else:
        outputs = out
    out = outputs.folder
    outputs.adopt(REPORT_FILES)
    outputs.claim(REPORT_FILES)
    atomic_write(out / "tune.json", lambda f: json.dump(result, f, indent=2, default=str), binary=False)
    md = render(result)
    png = plot(result, out / "tune.png")
    if png:
        md += f"\n![throughput per option]({png.name})\n"
    atomic_write(out / "tune.md", lambda f: f.write(md), binary=False)
    base = result["recipe_arg"]
    if base.endswith((".yaml", ".yml")):
        base = os.path.relpath(Path(base).resolve(), out.resolve())
    tuned = {"base": base, "description": f"{result['recipe']} tuned for {result['machine']['cpu']} by hasten tune"}
    for o in result["overrides"] + result["tuned_overrides"]:
        key, _, value = o.partition("=")
        node = tuned
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = yaml.safe_load(value) if value != "" else None
    atomic_write(out / "tuned.yaml", lambda f: yaml.safe_dump(tuned, f, sort_keys=False), binary=False)
    outputs.record(REPORT_FILES)
