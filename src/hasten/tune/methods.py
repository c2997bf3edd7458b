"""The method stage of `hasten tune --methods`: hasten's methods measured on the user's recipe, as
time to the quality the recipe as written reaches, on top of the systems settings the search
chose.

Candidates are the packaged methods that fit the model built (the trial worker's facts: 2-D
convolutions, an embedding table) and that the recipe does not already use: for a conv
classifier label smoothing, progressive resizing, EMA, Muon on the conv kernels, selective
backprop; for every recipe a warm-up/stable/decay schedule, a 1.5x learning rate and 0.8x the
run. Each is a recipe override; its runs are `hasten bench` runs (a process each, seeds paired
and interleaved, time to target with misses counted).

Successive halving within the budget:
1. a screen: the systems-tuned recipe and every candidate that fits the budget, one seed each
   (seed 0); the target is the systems-tuned run's final quality;
   A candidate that ended clearly better than the base (by more than 1% of its quality) but
   reached the target no sooner is screened again with its schedule compressed into 0.6x the
   run, when that leaves room to verify one: a decaying learning rate lifts quality at the end
   of its schedule, so a method's better quality turns into time only in a shorter run;
2. a verification: the base and the best screened candidates (those that reached the target
   sooner), two more seeds each, as many as the budget left holds; the target is then the
   base's worst final quality over its three seeds (the harness's @first-worst), and each
   candidate's time-to-target speed-up comes with its bootstrap interval.
A method is handed over only when it was verified and its speed-up's interval lies wholly above
1 (and every one of its runs reached the target: its quality is at least the base's worst, the
quality guard of this stage). One seed gives no interval: a screened-only winner is reported,
with the command that verifies it, and not handed over. Of several verified winners the
fastest is handed over: their combination was not measured.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..bench.report import analyse
from ..bench.runner import Spec, run_comparison, unique_labels
from ..bench.target import Target
from ..config import Recipe
from ..core import Time

SCREEN_SHARE = 0.5   # of the method stage's budget, at most, for the one-seed screen
SHORTER = 0.6        # a method that ends better but no sooner is screened again with its schedule in this share of the run
CLEARLY = 0.01       # ... when its final quality is better than the base's by more than this share of it
SYSTEMS_SHARE = 0.3   # with --methods: the systems search's share of the budget; the method stage has the rest


@dataclass
class Candidate:
    label: str
    overrides: list[str]
    what: str
    screen: dict = field(default_factory=dict)
    verified: dict = field(default_factory=dict)


def candidates(recipe: Recipe, facts: dict) -> list[Candidate]:
    """The methods that fit the model built and the recipe does not already use, most promising first."""
    out = []
    algos = recipe.algorithms
    image = bool(facts.get("conv2d")) and recipe.task in ("image_classification", "classification")
    if image and "label_smoothing" not in algos:
        out.append(Candidate("label smoothing 0.1", ["algorithms.label_smoothing={smoothing: 0.1}"],
                             "soft targets (docs/methods/label_smoothing.md)"))
    if image and "progressive_resizing" not in algos:
        out.append(Candidate("progressive resizing", ["algorithms.progressive_resizing={}"],
                             "smaller images early in the run (docs/methods/progressive_resizing.md)"))
    if recipe.optimizer.name != "muon" and (facts.get("conv2d") or facts.get("embedding")):
        # the rest keeps the recipe's optimizer family and its settings (optimizer.sgd or optimizer.adam)
        others = "sgd" if recipe.optimizer.name in ("sgd", "sgdw") else "adamw"
        if facts.get("conv2d"):   # the conv-kernel settings of hasten's CIFAR speedrun (cifar10-fast)
            out.append(Candidate("Muon", ["optimizer.name=muon", f"optimizer.muon.others={others}",
                                          "optimizer.muon.lr=0.24", "optimizer.muon.momentum=0.6",
                                          "optimizer.muon.ns_steps=3", "optimizer.muon.normalize=true"],
                                 "Muon on the conv kernels (cifar10-fast's settings), the rest as before "
                                 "(docs/methods/muon.md)"))
        else:
            out.append(Candidate("Muon", ["optimizer.name=muon", f"optimizer.muon.others={others}"],
                                 "Muon on the hidden matrices, the rest as before (docs/methods/muon.md)"))
    if recipe.schedule.name != "wsd":
        out.append(Candidate("warm-up/stable/decay schedule", ["schedule.name=wsd", "schedule.warmdown=0.3dur"],
                             "the learning rate held, then decayed over the last 30%"))
    if "ema" not in algos and "swa" not in algos:
        out.append(Candidate("EMA", ["algorithms.ema={half_life: 0.1dur}"], "an average of the weights, kept only "
                             "when it evaluates better (docs/methods/ema.md)"))
    if image and "selective_backprop" not in algos:
        out.append(Candidate("selective backprop", ["algorithms.selective_backprop={}"],
                             "the backward pass on the harder half of each batch (docs/methods/selective_backprop.md)"))
    out.append(Candidate("learning rate x1.5", [f"optimizer.lr={recipe.optimizer.lr * 1.5:.6g}"],
                         "a larger step with the recipe's schedule"))
    shorter = _scaled(recipe.trainer.max_duration, 0.8)
    if shorter:
        out.append(Candidate("0.8x the run", [f"trainer.max_duration={shorter}"], "the schedule compressed into 80% "
                             "of the steps"))
    return out


def _scaled(duration, factor: float) -> "str | None":
    try:
        t = Time.parse(duration)
    except ValueError:
        return None
    if t.unit.value not in ("ep", "ba", "sp", "tok"):
        return None
    value = t.value * factor
    if t.unit.value == "ep" and value != int(value):
        return f"{value:.3g}ep"
    return f"{max(1, int(round(value)))}{t.unit.value}"


def method_stage(recipe_arg: str, overrides: list[str], systems: list[str], recipe: Recipe, facts: dict,
                 budget_s: float, run_s: float, samples_per_run: float, out: Path, console, quality) -> dict:
    """Screen and verify the candidates (module doc) within `budget_s`, a run taking about
    `run_s`; bench's runs go to OUT/methods/. Returns the stage's record for the report."""
    cands = candidates(recipe, facts)
    every = f"{max(1, int(samples_per_run // 10))}sp"   # ten evaluations a run, the same cadence for every side
    shared = list(overrides) + list(systems)
    base = Spec("systems-tuned", recipe_arg, shared + [f"trainer.eval_interval={every}"])
    fits = max(0, int(budget_s * SCREEN_SHARE // max(run_s, 1.0)) - 1)
    screened, left_out = cands[:fits], cands[fits:]
    record = {"budget_s": budget_s, "run_s": run_s, "candidates": [], "left_out": [c.label for c in left_out],
              "handed_over": [], "eval_every": every,
              "screen_all_s": (len(cands) + 1) * run_s / SCREEN_SHARE}   # the stage's budget that screens every candidate
    if not screened:
        record["why"] = (f"the budget ({budget_s / 60:.0f} min) holds no screen: a run takes about {run_s / 60:.1f} "
                         "min; give a larger --budget")
        return record
    folder = out / "methods"
    target = Target(quality.metric, quality.op, None, True, "worst")

    def screen(group: list[Candidate]) -> tuple[list[Spec], dict]:
        """Seed 0 of the base (run once; a later call reuses it) and of each of `group`, whose
        screens are filled in; returns the group's specs and the analysis."""
        gspecs = unique_labels([base] + [Spec(c.label, recipe_arg, shared + c.overrides
                                              + [f"trainer.eval_interval={every}"]) for c in group])
        result = analyse(run_comparison(gspecs, [0], folder, None, console, metric=quality.metric),
                         [s.label for s in gspecs], target)
        base_ttt = result["recipes"][base.label]["median_time_to_target_s"]
        failed = {f["label"]: f.get("error") or "see its log" for f in result.get("failed", [])}
        for c, spec in zip(group, gspecs[1:]):
            rec = result["recipes"][spec.label]
            c.screen = {"reached": rec["reached"], "time_to_target_s": rec["median_time_to_target_s"],
                        "failed": failed.get(spec.label),
                        "speedup": (base_ttt / rec["median_time_to_target_s"])
                        if base_ttt and rec["median_time_to_target_s"] else None,
                        "final": rec["final_metric"]["mean"] if rec["final_metric"] else None}
        return gspecs[1:], result

    cand_specs, first = screen(screened)
    specs = [base] + cand_specs
    base_rec = first["recipes"][base.label]
    record["base_screen"] = {"final": base_rec["final_metric"]["mean"] if base_rec["final_metric"] else None,
                             "time_to_target_s": base_rec["median_time_to_target_s"]}
    spent = (len(screened) + 1) * run_s
    # A method whose run ends clearly better than the base's but reaches the target no sooner has
    # its gain at the end of its schedule (a decaying learning rate lifts quality late): screened
    # again with the schedule compressed into SHORTER of the run, when that leaves room to verify one.
    base_final, shorter = record["base_screen"]["final"], _scaled(recipe.trainer.max_duration, SHORTER)
    later = [Candidate(f"{c.label}, {SHORTER:g}x the run", c.overrides + [f"trainer.max_duration={shorter}"],
                       f"{c.what}, its schedule in {SHORTER:g}x the steps: it ended at {c.screen['final']:.4g} against "
                       f"the base's {base_final:.4g} and reached the target no sooner")
             for c in screened
             if shorter and base_final is not None and c.screen.get("final") is not None
             and not (c.screen["speedup"] and c.screen["speedup"] > 1.0)
             and quality.better(c.screen["final"], base_final)
             and abs(c.screen["final"] - base_final) > CLEARLY * abs(base_final)]
    if later and budget_s - spent - len(later) * SHORTER * run_s >= 4 * run_s:
        cands, screened, specs = cands + later, screened + later, specs + screen(later)[0]
        spent += len(later) * SHORTER * run_s
    elif later:
        record["not_shortened"] = [c.label for c in later]
    promising = sorted((c for c in screened if c.screen["speedup"] and c.screen["speedup"] > 1.0),
                       key=lambda c: -c.screen["speedup"])
    room = int((budget_s - spent) // max(2 * run_s, 1.0)) - 1   # base and each candidate: two more seeds
    verify = promising[:max(0, room)]
    if verify:
        vspecs = [specs[0]] + [s for s in specs[1:] if s.label in {c.label for c in verify}]
        runs = run_comparison(vspecs, [0, 1, 2], folder, None, console, metric=quality.metric)
        final = analyse(runs, [s.label for s in vspecs], target)
        record["target"] = final["target"]
        for c in verify:
            rec = final["recipes"][c.label]
            sp = rec["speedup_time_to_target"]
            c.verified = {"seeds": rec["runs"], "reached": rec["reached"], "speedup": sp.get("ratio"),
                          "low": sp.get("low"), "high": sp.get("high"),
                          "final": rec["final_metric"]["mean"] if rec["final_metric"] else None}
        winners = [c for c in verify if c.verified["reached"] == c.verified["seeds"] and c.verified["low"] is not None
                   and not math.isnan(c.verified["low"]) and c.verified["low"] > 1.0]
        if winners:
            best = max(winners, key=lambda c: c.verified["speedup"] or 0.0)
            record["handed_over"] = [best.label]
            record["overrides"] = best.overrides
    else:
        record["target"] = first["target"]
    record["candidates"] = [{"label": c.label, "overrides": c.overrides, "what": c.what, "screen": c.screen,
                             "verified": c.verified} for c in cands if c.screen or c.verified]
    # The command that verifies what the budget only screened (the verified ones have their verdict).
    unverified = [c for c in promising if not c.verified][:2]
    record["verify_command"] = ("hasten bench " + " ".join([recipe_arg] + [f"'{recipe_arg}+{'+'.join(c.overrides)}'"
                                                                           for c in unverified])
                                + "".join(f" {o}" for o in shared) + f" --eval-every {every} --seeds 3"
                                ) if unverified else None
    return record


def render(record: dict) -> list[str]:
    """The method stage's part of tune.md."""
    lines = ["", "## Methods", ""]
    if record.get("why"):
        return lines + [f"Not run: {record['why']}."]
    lines += [f"Time to the target ({record.get('target', '?')}) against the systems-tuned recipe, each run a "
              f"`hasten bench` run evaluated every {record['eval_every']}; a screen of one seed, then three seeds "
              "for the most promising (module doc of hasten.tune.methods).", "",
              "| method | screen (seed 0): speed-up | verified: seeds reached | verified: speed-up [95% interval] | "
              "verdict |", "|---|---|---|---|---|"]
    for c in record["candidates"]:
        s, v = c["screen"], c["verified"]
        final = s.get("final")
        screen = (f"{s['speedup']:.2f}x" if s.get("speedup") else
                  f"failed: {s['failed']}" if s.get("failed") else
                  (f"missed the target ({final:.4g})" if not s.get("reached") and final is not None
                   and not math.isnan(final) else "missed the target" if not s.get("reached") else "-"))
        if v:
            low = v.get("low")
            interval = (f"{v['speedup']:.2f}x [{low:.2f}, {v['high']:.2f}]" if v.get("speedup") is not None
                        and low is not None and not math.isnan(low) else "-")
            reached = f"{v['reached']}/{v['seeds']}"
        else:
            interval, reached = "-", "-"
        verdict = ("**handed over**" if c["label"] in record["handed_over"] else
                   "verified, not the fastest" if v and v.get("low") and v["low"] > 1.0 else
                   "not faster" if v else
                   "screened only: verify it" if s.get("speedup") and s["speedup"] > 1.0 else
                   "not measured: its run failed" if s.get("failed") else
                   "missed the target" if not s.get("reached") else "not faster")
        lines.append(f"| {c['label']} | {screen} | {reached} | {interval} | {verdict} |")
    b = record.get("base_screen")
    if b and b.get("final") is not None:
        lines += ["", f"The screen's target is the systems-tuned run's own final quality, {b['final']:.4g}"
                  + (f", which it reached in {b['time_to_target_s']:.0f} s of training." if b.get("time_to_target_s")
                     else ".")]
    if record.get("not_shortened"):
        lines += ["", f"Ended better but no sooner, not screened again with a shorter run (the budget): "
                  f"{', '.join(record['not_shortened'])}."]
    if record["left_out"]:
        total = record.get("screen_all_s")
        whole = (f"; a --budget of about {math.ceil(total / (1 - SYSTEMS_SHARE) / 60)} min screens every candidate"
                 if total else "")
        lines += ["", f"Not screened (the budget): {', '.join(record['left_out'])}{whole}."]
    if record.get("verify_command") and not record["handed_over"]:
        lines += ["", f"To verify the promising ones: `{record['verify_command']}`"]
    return lines


__all__ = ["Candidate", "candidates", "method_stage", "render"]
