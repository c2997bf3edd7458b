"""The ladder: from a baseline recipe to a target recipe, one change at a time.

The differences between the two validated recipes are grouped into steps: one per
algorithm the target adds (or removes), and one per section whose settings differ
(trainer, data, model, optimizer, schedule). Steps are applied cumulatively in the given
order; each is measured (one seed by default) under a time cap. The report separates
systems gains (less time per sample: same math, faster steps) from algorithmic gains
(fewer samples to the target).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..config import load_recipe, to_dict
from ..files import atomic_write
from ..provenance import describe as describe_code
from .runner import COUNTED, outcome
from .report import _f, final_metric, header, pyplot, latest_per_run, time_to_target, timed_duration
from .runner import Spec
from .target import Target

SECTIONS = ("trainer", "data", "model", "optimizer", "schedule")
IGNORED = {"name", "description"}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        # descend into sections, not into mappings keyed by patterns with dots ({"head.*": 12.6}),
        # which a dotted override cannot address: those are set whole
        if isinstance(v, dict) and v and not any("." in str(k2) for k2 in v):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _yaml_value(v) -> str:
    return json.dumps(v) if not isinstance(v, str) else v


def _load(text: str) -> dict:
    spec = Spec.parse(text)
    return to_dict(load_recipe(spec.recipe, spec.overrides))


def _optimizer_kind(recipe: dict) -> tuple:
    opt = recipe["optimizer"]
    return opt.get("name"), (opt.get("muon") or {}).get("others")


def ladder_steps(baseline: str, target: str, order: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """[(step name, overrides)] that turn `baseline` into `target`. Either end may carry
    overrides joined with '+', as in `hasten bench`: 'cifar10-fast+trainer.precision=bf16-mixed'."""
    a, b = _load(baseline), _load(target)
    steps: dict[str, list[str]] = {}
    for section in SECTIONS:
        fa, fb = _flatten(a[section], section + "."), _flatten(b[section], section + ".")
        diff = [f"{k}={_yaml_value(fb[k])}" for k in fb if fa.get(k) != fb[k]]
        # a key the target no longer has; not one that became a mapping there ({} -> {"head.*": 12.6})
        diff += [f"{k}=null" for k in fa if k not in fb and not any(j.startswith(k + ".") for j in fb)]
        if diff and section == "model" and a["model"].get("name") != b["model"].get("name"):
            # another network: its keys are another constructor's, so the section is replaced whole
            diff = [f"model={json.dumps(b['model'])}"]
        if diff and section == "optimizer" and _optimizer_kind(a) != _optimizer_kind(b):
            # another optimizer: its sub-sections are others, so the section is replaced whole
            diff = [f"optimizer={json.dumps(b['optimizer'])}"]
        if diff:
            steps[section] = diff
    for name, params in b["algorithms"].items():
        if a["algorithms"].get(name) != params:
            steps[name] = [f"algorithms.{name}={json.dumps(params)}"]
    for name in a["algorithms"]:
        if name not in b["algorithms"]:
            steps[f"remove:{name}"] = [f"algorithms.{name}=null"]
    if order:
        unknown = [s for s in order if s not in steps]
        if unknown:
            raise ValueError(f"--order names {unknown}, which are not steps; steps are {list(steps)}")
        names = order + [s for s in steps if s not in order]
    else:
        names = list(steps)
    return [(n, steps[n]) for n in names]


def ladder_specs(baseline: str, target: str, order: list[str] | None = None, shared: list[str] = (),
                 last: list[str] = ()) -> list[tuple[str, Spec]]:
    """The rows of the ladder. `shared` overrides apply to every row, but a step that sets the
    same key wins; `last` overrides win over every step (the harness's evaluation cadence)."""
    base = Spec.parse(baseline, shared)
    last = list(last)
    specs, acc = [("baseline", Spec(label="baseline", recipe=base.recipe, overrides=base.overrides + last))], []
    for name, overrides in ladder_steps(baseline, target, order):
        acc = acc + overrides
        specs.append((name, Spec(label=f"+{name}", recipe=base.recipe, overrides=base.overrides + acc + last)))
    return specs


def ladder_markdown(runs: list[dict], steps: list[tuple[str, Spec]], target: Target, title: str,
                    command: str | None = None) -> tuple[str, list[dict]]:
    runs = latest_per_run(runs)
    rows = []
    prev = None
    first_ttt = None
    for name, spec in steps:
        rs = [r for r in runs if r["label"] == spec.label and outcome(r) in COUNTED]
        hits = [h for h in (time_to_target(r, target) for r in rs) if h]
        finals = [v for v in (final_metric(r, target.metric) for r in rs) if v is not None]
        per_sample = [timed_duration(r) / r["final"]["sample"] for r in rs if r.get("final") and r["final"]["sample"]]
        ttt = sum(h["seconds"] for h in hits) / len(hits) if hits else None
        sps = sum(h["samples"] for h in hits) / len(hits) if hits else None
        spp = sum(per_sample) / len(per_sample) if per_sample else None
        # a capped run has no final record: estimate its time per sample from its last
        # evaluation, or, capped before its first one, from its last progress record
        if spp is None and rs and (rs[0].get("evals") or rs[0].get("progress")):
            e = rs[0]["evals"][-1] if rs[0].get("evals") else rs[0]["progress"]
            spp = e["train_s"] / e["sample"] if e["sample"] else None
        # where the final value was read: the run's end, or its last evaluation before the cap
        at = [r["final"]["sample"] if r.get("final") else (r["evals"][-1]["sample"] if r.get("evals") else None)
              for r in rs]
        row = {"step": name, "label": spec.label, "status": [outcome(r) for r in rs], "reached": len(hits),
               "runs": len(rs), "time_to_target_s": ttt, "samples_to_target": sps, "s_per_sample": spp,
               "final": sum(finals) / len(finals) if finals else None, "metric": target.metric,
               "final_at_sample": max((a for a in at if a is not None), default=None),
               "capped": any(outcome(r) == "capped" for r in rs)}
        if prev is not None:
            row["systems_x"] = prev["s_per_sample"] / spp if prev["s_per_sample"] and spp else None
            row["algorithmic_x"] = (prev["samples_to_target"] / sps
                                    if prev["samples_to_target"] and sps else None)
        if first_ttt is None:
            first_ttt = ttt
        row["cumulative_x"] = first_ttt / ttt if first_ttt and ttt else None
        rows.append(row)
        prev = row
    lines = header(title, target, "One step at a time from the baseline; each row adds one change to the row above. "
                   "systems x: time per sample of the row above / this row (same math, faster steps); algorithmic x: "
                   "samples to target of the row above / this row; cumulative: baseline time to target / this row's. "
                   "final: the metric at the end of the run, or, for a run stopped by the time cap, at its last "
                   "evaluation (samples seen then in brackets).",
                   command)
    lines += ["| step | status | reached | time to target (s) | samples to target | ms per 1k samples | "
              "final | systems x | algorithmic x | cumulative x |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = r["s_per_sample"] * 1e6 if r["s_per_sample"] else None
        final = _f(r["final"], 4)
        if r["capped"] and r["final_at_sample"] is not None:
            final += f" ({r['final_at_sample']:,} sp)"
        lines.append(f"| {r['step']} | {','.join(r['status'])} | {r['reached']}/{r['runs']} | {_f(r['time_to_target_s'], 1)} | "
                     f"{_f(r['samples_to_target'], 0)} | {_f(ms, 1)} | {final} | "
                     f"{_f(r.get('systems_x'), 2)} | {_f(r.get('algorithmic_x'), 2)} | {_f(r.get('cumulative_x'), 2)} |")
    codes = {json.dumps(r["final"].get("code"), sort_keys=True) for r in runs if r.get("final")}
    lines += [""] + [f"Code: {describe_code(json.loads(c))}" for c in sorted(codes)]
    return "\n".join(lines) + "\n", rows


def ladder_plot(rows: list[dict], path: Path) -> Path | None:
    """Panels, one bar per row: time to target ('miss' where the row did not reach it; left out
    when no row did), time per 1,000 samples (the systems side), and the final metric (at the
    cap, hatched, for capped runs)."""
    plt = pyplot()
    if plt is None:
        return None
    names = [r["step"] for r in rows]
    x = range(len(rows))
    nan = math.nan
    ttt = [r["time_to_target_s"] if r["time_to_target_s"] is not None else nan for r in rows]
    ms = [r["s_per_sample"] * 1e6 if r["s_per_sample"] else nan for r in rows]
    fin = [r["final"] if r["final"] is not None else nan for r in rows]
    reached = not all(math.isnan(t) for t in ttt)   # no row reached the target: no time-to-target panel
    fig, axes = plt.subplots(2 + reached, 1, figsize=(max(6, len(rows) * 0.8), 3 * (2 + reached)), sharex=True)
    axes[0].set_title("ladder: each row adds one change to the row above"
                      + ("" if reached else " (no row reached the target)"))
    if reached:
        ax = axes[0]
        ax.bar(x, [0 if math.isnan(t) else t for t in ttt], color="#3a7")
        for i, t in enumerate(ttt):
            ax.text(i, 0 if math.isnan(t) else t, "miss" if math.isnan(t) else f"{t:.0f}s", ha="center",
                    va="bottom", fontsize=8)
        ax.set_ylabel("time to target (s)")
    ax = axes[-2]
    ax.bar(x, ms, color="#37a")
    ax.set_ylabel("ms per 1k samples")
    ax = axes[-1]
    bars = ax.bar(x, fin, color="#a73")
    for b, r in zip(bars, rows):
        if r.get("capped"):
            b.set_hatch("//")
    metric = rows[0].get("metric", "final") if rows else "final"
    ax.set_ylabel(f"final {metric}\n(hatched: at the cap)")
    ax.set_xticks(list(x), names, rotation=30, ha="right")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    return path
