"""The search of `hasten tune`: measure the systems settings on the user's own model and machine, and write
the fastest recipe.

    hasten tune cifar10-narrow                      # ~10 minutes; a table, a plot, tuned.yaml
    hasten train tune-results/cifar10-narrow/tuned.yaml
    hasten tune shakespeare-char-baseline --lr      # a learning-rate range test instead

What is searched, in this order, each decision fixed before the next (so the later ones are
measured under the earlier winners: channels-last under the chosen precision, and so on):
precision (fp32, bf16-mixed where the CPU or GPU has bf16 hardware, fp16-mixed on a GPU),
channels-last (models with 2-D convolutions), `torch.compile` (off, default; the reduce-
overhead mode on a GPU), the optimizers' steps compiled or not (a GPU), the data path (the
device-resident loader or a DataLoader with workers, where the task has both), intra-op
threads (CPU), the host allocator settings (CPU), and micro-batches of the recipe's global
batch (the whole batch, halves, quarters: the largest that fits and the fastest). A setting
that cannot help here is not tried, and says why (bf16 on a CPU without bf16 hardware is
emulated: many times slower).

Each trial is its own process, started fresh: warm-up steps are excluded (the first step's
extra time is reported as compilation), then enough steps for at least a few seconds of
measurement; the options of a stage alternate over rounds (A B A B ...) so that drift does
not favour one. A stage's throughput is samples per second from the median step time, with a
95% bootstrap interval over the measured steps; a crash, an out-of-memory or a refusal is
recorded with its reason. An option is taken only when it beats the incumbent (the recipe's
own setting, which otherwise stays) three ways: its interval's lower end clears the incumbent's
median; it is faster in every round, so one quiet spell cannot carry it; and the recipe's
whole run is projected at least `--min-gain` (default 5%) shorter, counting the option's
one-time cost (the first step's extra time: compilation) against the steps it saves. On a
shared machine gains under a few percent are inside run-to-run drift; they are not handed
over. The tuned recipe then runs against the recipe as written, interleaved; unless it clears
the same bar against that run and against the recipe as written measured when the search
began, the tune hands over the recipe as written and says so.

Quality guard: an option that changes the arithmetic (precision, compilation; micro-batches
where the model has batch norm, whose statistics then come from each micro-batch) must keep
the training loss over the first steps within a tolerance of the recipe's own arithmetic: the
mean loss over the last half of `guard_steps` steps, against the spread of two reference runs
(seeds 0 and 1) in fp32, uncompiled, at the recipe's own micro-batch: |tuned - reference mean|
<= max(3 x the reference spread, 2% of the reference). An option that fails is reported and
excluded. The recipe's own arithmetic is what it runs on this machine (`precision: auto` is
bf16-mixed where the CPU has bf16 hardware: keeping it there needs no check). The guard's runs
are kept back from the budget once an option that needs them is chosen, and a stage whose
options would need them is searched only when it and the guard fit; an option the guard could
not check (the budget ran short, a guard run failed) is excluded too: nothing that changes the
arithmetic is handed over unchecked.

The budget holds: a stage that does not fit is skipped; a round after a stage's first runs only
when it fits, costed at what the same trials took in the round before; the report says what
was skipped or cut short, and where the minutes went.

Why each change won: every stage whose choice is not the recipe's own setting gets two
profiled windows (the recipe's setting, the winner), and the report names the phases that
moved (data, forward, backward, optimizer...).

Output (`--out`, default tune-results/RECIPE): `tune.md` (the table and the one-line
summary), `tune.json`, `tune.png` (throughput per option with intervals), `tuned.yaml` (the
recipe as `base:` plus the winning overrides, which `hasten train` runs as it is). The result
is cached per machine and recipe (`$HASTEN_DATA/tune/`): a second call prints it at once
(`--fresh` measures again).
"""
from __future__ import annotations

import contextlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import TextColumn, TimeElapsedColumn

from ..callbacks.progress import work_progress
from ..config import load_recipe, to_dict
from ..core import Time
from ..errors import BusyMachineError, ConfigError
from ..files import atomic_write
from ..processes import spawn, stop
from ..provenance import code_version
from ..registry import TASKS
from .plan import (BATCH_STATS, GUARDED, KEYS, Option, Trial, _default, cache_path, data_wait, first_step_extra,
                   loader_cores, machine_key, read_cache, round_medians, stages, throughput)
from .methods import SYSTEMS_SHARE, method_stage
from .report import REPORT_FILES, report_outputs, write

BUSY_SHARE = 0.25   # other processes' share of the cores above which a trial is run again
BUSY_TRIES = 3      # tries of a trial before the search stops: the machine is busy


class Tuner:
    guarded = GUARDED   # the stages the quality guard checks; micro-batches join when the model has batch norm

    def __init__(self, recipe_arg: str, overrides: list[str], budget_s: float, out: Path, console: Console,
                 rounds: int = 2, guard_steps: int = 150, min_seconds: float = 4.0, steps: int = 8, warmup: int = 3,
                 min_gain: float = 0.05, profile_steps: int = 10):
        self.recipe_arg, self.overrides = recipe_arg, list(overrides)
        self.recipe = load_recipe(recipe_arg, overrides)
        self.budget_s, self.out, self.console = budget_s, out, console
        self.rounds, self.guard_steps = rounds, guard_steps
        self.min_seconds, self.steps, self.warmup = min_seconds, steps, warmup
        self.profile_steps = profile_steps
        if not 0 <= min_gain < 1:
            raise ConfigError(f"--min-gain {min_gain}: give a fraction in [0, 1), e.g. 0.05 for 5%")
        self.min_gain = min_gain
        self.code = code_version()   # the code that runs the search, recorded with its result
        self.t0 = time.perf_counter()
        self.spent_per_trial: list[float] = []
        self.trial_parts: list[tuple[float, float]] = []   # per trial: (start-up s, median step s)
        self.shortened: list[dict] = []   # stages measured in fewer rounds than asked, and why
        self.spent_by: dict[str, float] = {}   # seconds per part of the search: where the budget went
        self.busy: list[float] = []   # other processes' share of the cores in trials run again for it
        self.facts: dict | None = None

    # ------------------------------------------------------------------ trials
    def run_trial(self, overrides: list[str], label: str, seed: int = 0, max_steps: int | None = None,
                  steps: int | None = None, min_seconds: float | None = None, profile: int | None = None) -> dict:
        """One trial in its own process; run again (at most BUSY_TRIES times in all) while other
        processes held more than BUSY_SHARE of the cores during its measured steps: no decision
        is made from a trial that shared the machine (a BusyMachineError when it stays busy)."""
        for attempt in range(BUSY_TRIES):
            result = self._trial_once(overrides, label, seed, max_steps, steps, min_seconds, profile)
            busy = result.get("others_share")
            if busy is None or busy <= BUSY_SHARE:
                return result
            self.busy.append(busy)
        raise BusyMachineError(f"hasten tune: the machine was busy: other processes used {busy:.0%} of its cores while "
                               f"the trial '{label}' ran, {BUSY_TRIES} times; rerun when it is idle (nothing was "
                               "decided from those trials)")

    def _trial_once(self, overrides, label, seed, max_steps, steps, min_seconds, profile) -> dict:
        with tempfile.TemporaryDirectory(prefix="hasten-tune-") as tmp:
            spec = {"label": label, "recipe": self.recipe_arg, "overrides": self.overrides + overrides, "seed": seed,
                    "run_dir": str(Path(tmp) / "run"), "warmup": self.warmup, "steps": steps or self.steps,
                    "min_seconds": self.min_seconds if min_seconds is None else min_seconds,
                    "max_steps": max_steps or max(60, self.warmup + self.steps), "profile": profile}
            Path(tmp, "spec.json").write_text(json.dumps(spec))
            t = time.perf_counter()
            with open(Path(tmp, "log.txt"), "w+") as log:
                proc = spawn([sys.executable, "-m", "hasten.tune.worker", str(Path(tmp, "spec.json")),
                              str(Path(tmp, "out.json"))], stdout=log, stderr=subprocess.STDOUT, text=True)
                try:
                    proc.wait()
                except BaseException:   # Ctrl-C, SIGTERM (Terminated): the worker goes first, then its folder
                    stop(proc, grace_s=5.0)
                    raise
                log.seek(0)
                output = log.read()
            wall = time.perf_counter() - t
            self.spent_per_trial.append(wall)
            try:
                result = json.loads(Path(tmp, "out.json").read_text())
            except (OSError, ValueError):
                tail = output.strip().splitlines()[-1:] or ["no output"]
                result = {"label": label, "status": "failed", "reason": f"the trial process ended ({proc.returncode}): "
                                                                       f"{tail[0][:200]}"}
        result["warmup"], result["wall_s"] = self.warmup, wall
        times = result.get("times") or []
        if result.get("status") == "ok" and len(times) > self.warmup and not profile:   # (profiled steps run slower)
            self.trial_parts.append((max(0.0, self.spent_per_trial[-1] - sum(times)),
                                     statistics.median(times[self.warmup:])))
        return result

    def left_s(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def trial_cost(self) -> float:
        return statistics.median(self.spent_per_trial) if self.spent_per_trial else 30.0

    def measure(self, options: list[Option], fixed: list[str], progress, task, reserve: float = 0.0) -> list[Trial]:
        """Every option under the settings fixed so far, interleaved over rounds. A round after
        the first runs only when it fits in the budget left less `reserve`, its cost being what
        the same trials took in the round before; a stage cut short says so (`self.shortened`)."""
        trials = [Trial(o) for o in options]
        for r in range(self.rounds):
            if r > 0:
                need = sum(tr.results[-1].get("wall_s", 0.0) for tr in trials if tr.results and not tr.failure)
                if need > self.left_s() - reserve:
                    self.shortened.append({
                        "stage": options[0].stage, "rounds": r,
                        "why": f"{r} round{'s' if r > 1 else ''} of {self.rounds}: the next needs about {need:.0f} s "
                               f"and the budget left is {max(0.0, self.left_s()):.0f} s"
                               + (f", {reserve:.0f} s of it kept for what follows" if reserve else "")})
                    progress.advance(task, sum(1 for tr in trials if not tr.failure) * (self.rounds - r))
                    break
            order = trials if r % 2 == 0 else list(reversed(trials))
            for tr in order:
                if tr.failure and r > 0:
                    continue
                res = self.run_trial(fixed + tr.option.overrides, tr.option.label)
                res["round"] = r
                tr.results.append(res)
                progress.advance(task)
        return trials

    # ------------------------------------------------------------------ the search
    def search(self) -> dict:
        batch = self.recipe.data.batch_size
        fixed: list[str] = []
        table, decisions, skipped = [], {}, []
        plan = stages(self.recipe)
        total = sum(len(o) for _, o, _ in plan) * self.rounds + 3 * self.rounds
        budget = time.strftime("%H:%M:%S", time.gmtime(self.budget_s)).lstrip("0:") or "0"
        with work_progress("tune", self.console, TextColumn("{task.description}"), TimeElapsedColumn(),
                           TextColumn(f"of a {budget} budget")) as progress:
            task = progress.add_task("", total=total)
            with self._clock("as written"):
                written = self.measure([Option("as written", "the recipe as written", [])], [], progress, task)[0]
            if written.failure or not written.times:   # nothing to tune, and nothing to cache
                raise ConfigError(f"hasten tune: the recipe as written does not train on this machine "
                                  f"({(written.failure or 'no step was timed')[:300]}); `hasten train` with the "
                                  "same recipe and overrides shows the whole error")
            base_tp = throughput(written, batch)
            facts = next((r["facts"] for r in written.results if r.get("facts")), None)
            plan = stages(self.recipe, facts)   # the stages of the model and loaders built, not of the task's name
            if any(r.get("batch_norm") for r in written.results):   # the worker saw batch-norm layers
                self.guarded = GUARDED + (BATCH_STATS,)
            # what the search will cost, from the trials of the recipe as written: a stage whose
            # options change the arithmetic is searched only when its quality guard fits too, and
            # once such an option is chosen, the guard's cost is kept back from the stages after it
            cost = self.trial_cost()
            needs = {n: len(o) * self.rounds * cost for n, o, why in plan if o and not why}
            final_cost = 2 * self.rounds * cost
            self.facts = facts
            for name, options, why in plan:
                options = self._distinct(options, fixed)
                if len(options) == 1 and not why:
                    why = "its options are the same recipe here"
                if not options or why:
                    skipped.append({"stage": name, "why": why or "nothing to choose"})
                    if options:
                        fixed += options[0].overrides
                        decisions[name] = options[0].label
                    continue
                # the guard's cost again, from the step times measured so far (its references run in fp32)
                guard_cost = self._guard_cost(table)
                pending = name in self.guarded or bool(self._changed(table))   # the guard will have to run
                need, reserve = needs[name], final_cost + (guard_cost if pending else 0.0)
                done = set(decisions) | {s["stage"] for s in skipped}
                later = sum(v for n, v in needs.items() if n not in done)
                want = math.ceil((time.perf_counter() - self.t0 + later + guard_cost + final_cost) / 60)
                fits = f"--budget {want}m would fit the whole search"
                if name in self.guarded and need > self.left_s() - reserve:
                    skip = (f"this stage and the quality guard its options need (about {need + guard_cost:.0f} s) "
                            f"do not fit in the budget left ({self.left_s():.0f} s, {final_cost:.0f} s of it kept for "
                            f"the final check); the recipe's own setting is kept ({fits})")
                elif need > self.left_s() - reserve:   # the guard's runs and the final check are kept back
                    kept = "the quality guard and the final check" if pending else "the final check"
                    skip = (f"the budget left ({self.left_s():.0f} s, {reserve:.0f} s of it kept for {kept}) is "
                            f"less than the stage needs (about {need:.0f} s; {fits})")
                else:
                    skip = None
                if skip:
                    skipped.append({"stage": name, "why": skip})
                    progress.advance(task, len(options) * self.rounds)
                    continue
                progress.update(task, description=name)
                with self._clock(name):
                    trials = self.measure(options, fixed, progress, task, reserve=reserve)
                rows = []
                for tr in trials:
                    tp = throughput(tr, batch)
                    ok = any(r.get("status") == "ok" for r in tr.results)
                    rows.append({"stage": name, "option": tr.option.label, "overrides": tr.option.overrides,
                                 "throughput": tp, "first_step_extra_s": first_step_extra(tr) if ok else None,
                                 "round_step_s": round_medians(tr), "miss": tr.failure,
                                 "data_wait": data_wait(tr), "loader_cores": loader_cores(tr)})
                winner = self._choose(trials, rows, self.run_steps(trials))
                for row in rows:
                    row["chosen"] = row["option"] == winner.option.label
                table += rows
                fixed += winner.option.overrides
                decisions[name] = winner.option.label
            with self._clock("quality guard"):
                guard = self._guard(fixed, decisions, table, progress, task)
            with self._clock("profiles"):
                why = self._explain(fixed, table, progress, task, reserve=final_cost)
            if fixed:
                progress.update(task, description="the tuned recipe against the recipe as written")
                with self._clock("final check"):
                    final = self.measure([Option("final", "tuned", fixed), Option("final", "as written", [])], [],
                                         progress, task)
            else:   # nothing to hand over: the recipe as written, measured once
                final = [written, written]
        tuned_tp, written_tp = throughput(final[0], batch), throughput(final[1], batch) or base_tp
        handed, run_steps = fixed, self.run_steps(final)
        handover = self._hand_over(final[0], final[1], written, run_steps) if fixed else {"passed": False, "why": {}}
        if fixed and not handover["passed"]:
            handed = []   # not clearly faster than the recipe as written: that is what is handed over
            decisions = {k: f"{v} (not handed over: the tuned recipe did not beat the recipe as written by "
                            f"{self.min_gain:.0%})" for k, v in decisions.items()}
        return {"recipe": self.recipe.name, "recipe_arg": self.recipe_arg, "overrides": self.overrides,
                "machine": machine_key(), "table": table, "decisions": decisions, "skipped": skipped,
                "guard": guard, "tuned_overrides": handed, "searched_overrides": fixed, "min_gain": self.min_gain,
                "handover": handover, "facts": self.facts, "busy": self.busy,
                "run_steps": run_steps, "tuned": tuned_tp, "as_written": written_tp,
                "speedup": (tuned_tp["samples_per_s"] / written_tp["samples_per_s"]) if tuned_tp and written_tp else None,
                "budget_s": self.budget_s, "spent_s": time.perf_counter() - self.t0,
                "spent_by": {k: round(v, 1) for k, v in self.spent_by.items()}, "shortened": self.shortened,
                "why": why, "date": time.strftime("%Y-%m-%d %H:%M"), "code": self.code}

    @contextlib.contextmanager
    def _clock(self, part: str):
        """Adds the seconds spent inside to `spent_by[part]`: where the budget went."""
        t = time.perf_counter()
        try:
            yield
        finally:
            if time.perf_counter() - t >= 0.05:   # a part that ran nothing is left out
                self.spent_by[part] = self.spent_by.get(part, 0.0) + time.perf_counter() - t

    def run_steps(self, trials: list[Trial]) -> float | None:
        """The recipe's whole run in steps (its max_duration, in batches), from what the trials
        saw (batches per epoch, tokens per batch); None where it cannot be told."""
        try:
            d = Time.parse(self.recipe.trainer.max_duration)
        except ValueError:
            return None
        value, unit = float(d.value), d.unit.value
        seen = [r for t in trials for r in t.results if r.get("status") == "ok"]
        per_epoch = next((r.get("steps_per_epoch") for r in seen if r.get("steps_per_epoch")), None)
        tokens = next((r.get("tokens_per_step") for r in seen if r.get("tokens_per_step")), None)
        return {"ba": value, "ep": value * per_epoch if per_epoch else None,
                "sp": value / self.recipe.data.batch_size, "tok": value / tokens if tokens else None}.get(unit)

    def _beats(self, tr: Trial, tp: dict | None, inc: Trial, inc_tp: dict | None, steps: float | None) -> bool:
        return self._verdict(tr, tp, inc, inc_tp, steps) is None

    def _verdict(self, tr: Trial, tp: dict | None, inc: Trial, inc_tp: dict | None, steps: float | None) -> "str | None":
        """None when option `tr` beats the incumbent `inc` (see the module doc): its interval
        clears the incumbent's median, it is faster in every round both ran, and the whole run
        (its steps, plus the one-time cost of the first step) is projected `min_gain` shorter;
        else which rule it failed, with the numbers."""
        if tp is None:
            return "not measured"
        if inc_tp is None:
            return None
        if tp["low"] <= inc_tp["samples_per_s"]:
            return (f"its interval [{tp['low']:,.1f}, {tp['high']:,.1f}] does not clear the other's median "
                    f"{inc_tp['samples_per_s']:,.1f} samples/s")
        mine, theirs = round_medians(tr), round_medians(inc)
        slower = [r for r in mine if r in theirs and mine[r] >= theirs[r]]
        if slower:
            r = slower[0]
            return (f"in round {r + 1} it was not faster ({mine[r]:.3f} s a step against {theirs[r]:.3f} s): the "
                    "machine's speed moved between rounds")
        n = steps or 1.0
        extra, extra_inc = (first_step_extra(tr), first_step_extra(inc)) if steps else (0.0, 0.0)
        run, run_inc = n * tp["step_s"] + extra, n * inc_tp["step_s"] + extra_inc
        if run_inc < run * (1 + self.min_gain):
            return (f"the whole run of {n:,.0f} steps is projected {run:,.1f} s against {run_inc:,.1f} s "
                    f"(first step {extra:.1f} s against {extra_inc:.1f} s): less than {self.min_gain:.0%} shorter")
        return None

    def _explain(self, fixed: list[str], table: list[dict], progress, task, reserve: float = 0.0) -> dict:
        """Why each change won: for every stage whose chosen option is not the recipe's own
        setting, one profiled window (`profile_steps` steps after the warm-up) with the recipe's
        setting and one with the winner, both on top of the other chosen settings, phase by
        phase (data, forward, backward, optimizer...). Run only where the budget left, less
        `reserve`, holds both windows."""
        changed = []
        for stage in dict.fromkeys(r["stage"] for r in table):
            rows = [r for r in table if r["stage"] == stage]
            chosen = next((r for r in rows if r.get("chosen")), None)
            if chosen is not None and chosen is not rows[0]:
                changed.append((stage, rows[0], chosen))
        if not changed:
            return {"stages": [], "why": "no setting changed"}
        need = 2 * len(changed) * self.trial_cost()
        if need > self.left_s() - reserve:
            return {"stages": [], "why": f"not profiled: {len(changed)} pair(s) of windows need about {need:.0f} s "
                                         f"and the budget left is {max(0.0, self.left_s() - reserve):.0f} s"}
        progress.update(task, description="profiles: why the winners won")
        out = []
        for stage, own, winner in changed:
            pair = []
            for row in (own, winner):
                res = self.run_trial(fixed + row["overrides"], f"profile {row['option']}", profile=self.profile_steps,
                                     steps=self.profile_steps + 1, min_seconds=0.0,
                                     max_steps=self.warmup + self.profile_steps + 2)
                pair.append(res.get("profile"))
            if all(pair):
                out.append({"stage": stage, "from": own["option"], "to": winner["option"],
                            "step_ms": [pair[0]["step_ms"], pair[1]["step_ms"]],
                            "ms": {k: [pair[0]["ms"].get(k, 0.0), pair[1]["ms"].get(k, 0.0)] for k in pair[0]["ms"]}})
            else:
                out.append({"stage": stage, "from": own["option"], "to": winner["option"],
                            "miss": "a profiled window did not finish"})
        return {"stages": out, "steps": self.profile_steps}

    def _hand_over(self, tuned: Trial, written_now: Trial, written_first: Trial, steps: float | None) -> dict:
        """Whether the tuned settings are handed over: they must beat the recipe as written in
        the final check (interleaved with it) and also as it was measured when the search began.
        A slow spell that falls on the final check's as-written trials alone cannot then pass a
        gain inside the machine's drift as a win. Returns {"passed", "why": {check: reason}}."""
        batch = self.recipe.data.batch_size
        why = {name: self._verdict(tuned, throughput(tuned, batch), w, throughput(w, batch), steps)
               for name, w in (("final check", written_now), ("first measurement", written_first))}
        return {"passed": all(v is None for v in why.values()), "why": {k: v for k, v in why.items() if v}}

    def _distinct(self, options: list[Option], fixed: list[str]) -> list[Option]:
        """The options whose recipes differ: one that resolves to the same recipe as an earlier
        option of its stage (the recipe's own setting spelled another way) is measured once."""
        seen, out = [], []
        for o in options:
            try:
                resolved = to_dict(load_recipe(self.recipe_arg, self.overrides + fixed + o.overrides))
            except ConfigError:
                out.append(o)   # a trial will say what is wrong with it
                continue
            if resolved not in seen:
                seen.append(resolved)
                out.append(o)
        return out

    def _choose(self, trials: list[Trial], rows: list[dict], steps: float | None = None) -> Trial:
        """The first option (the incumbent: the recipe's own setting) unless another beats it
        (`_beats`); then the best of those that beat it, each next one beating the last."""
        best, best_tp = trials[0], rows[0]["throughput"]
        for tr, row in zip(trials[1:], rows[1:]):
            if row["miss"]:
                continue
            if self._beats(tr, row["throughput"], best, best_tp, steps):
                best, best_tp = tr, row["throughput"]
        return best

    def _guard(self, fixed: list[str], decisions: dict, table: list[dict], progress, task) -> dict:
        """The quality guard for the winners that change the arithmetic (see the module doc)."""
        changed = self._changed(table)
        if not changed:
            return {"checked": False, "why": "no option that changes the arithmetic was chosen"}
        if (need := self._guard_cost(table)) > self.left_s():
            why = (f"not enough budget left for {self.guard_steps} guard steps (about {need:.0f} s needed, "
                   f"{max(0.0, self.left_s()):.0f} s left)")
            self._exclude(changed, fixed, decisions, table, "excluded: the quality guard could not check it")
            return {"checked": False, "why": why, "excluded": changed}
        progress.update(task, description="quality guard")
        # the reference: fp32, uncompiled, at the recipe's own micro-batch
        ref_over = [o for o in fixed if not any(o.startswith(KEYS[k]) for k in self.guarded)]
        ref_over += ["trainer.precision=fp32", "trainer.compile=false"]
        kw = dict(max_steps=self.guard_steps, steps=self.guard_steps, min_seconds=0.0)
        refs = [self.run_trial(ref_over, "reference", seed=s, **kw) for s in (0, 1)]
        tuned = self.run_trial(fixed, "tuned", seed=0, **kw)
        progress.advance(task, 3)

        def tail_mean(r):
            xs = [x for x in r.get("losses", []) if x is not None and math.isfinite(x)]
            xs = xs[len(xs) // 2:]
            return sum(xs) / len(xs) if xs else None
        ref_vals = [tail_mean(r) for r in refs if r.get("status") == "ok"]
        tuned_val = tail_mean(tuned) if tuned.get("status") == "ok" else None
        if len(ref_vals) < 2 or tuned_val is None:
            self._exclude(changed, fixed, decisions, table, "excluded: the quality guard could not check it")
            return {"checked": False, "why": "a guard run failed", "runs": [r.get("reason") for r in refs + [tuned]],
                    "excluded": changed}
        ref = sum(ref_vals) / 2
        spread = abs(ref_vals[0] - ref_vals[1])
        tol = max(3 * spread, 0.02 * abs(ref))
        ok = abs(tuned_val - ref) <= tol
        out = {"checked": True, "passed": ok, "options": changed, "steps": self.guard_steps, "reference": ref_vals,
               "tuned": tuned_val, "tolerance": tol}
        if not ok:   # the arithmetic-changing options go back to the recipe's own
            self._exclude(changed, fixed, decisions, table, "excluded by the quality guard")
        return out

    def _changed(self, table: list[dict]) -> list[str]:
        """The guarded stages whose chosen option changes the recipe's own arithmetic."""
        return [s for s in self.guarded if any(r["stage"] == s and r["chosen"] and r["option"] != _default(s, self.recipe)
                                               for r in table)]

    def _guard_cost(self, table: "list[dict] | tuple" = ()) -> float:
        """Seconds the quality guard's three runs of guard_steps steps are expected to take: each
        a trial's start-up (its wall time less its steps) plus guard_steps steps. The two
        references run in fp32: at the fp32 option's step time where the precision stage measured
        it; the tuned run at the step time of the last option chosen; either, before it is
        measured, at the step time of the first trials (the recipe as written). Before any
        trial, a guess of 30 s per 30 steps."""
        if not self.trial_parts:
            return 3 * self.trial_cost() * max(1.0, self.guard_steps / 30)
        startup = statistics.median(t for t, _ in self.trial_parts)
        step = statistics.median(st for _, st in self.trial_parts[:self.rounds])

        def measured(rows):
            return next((r["throughput"]["step_s"] for r in reversed(rows) if r.get("throughput")), step)
        ref = measured([r for r in table if r["stage"] == "precision" and r["option"] == "fp32"])
        tuned = measured([r for r in table if r.get("chosen")])
        return 3 * startup + self.guard_steps * (2 * ref + tuned)

    @staticmethod
    def _exclude(stages: list[str], fixed: list[str], decisions: dict, table: list[dict], why: str) -> None:
        """Winners that change the arithmetic go back to the recipe's own settings: one the
        guard rejected, or one it could not check (never handed over unverified)."""
        for s in stages:
            fixed[:] = [o for o in fixed if not o.startswith(KEYS[s])]
            decisions[s] = f"{why} (was {decisions[s]})"
            for row in table:
                if row["stage"] == s and row["chosen"]:
                    row["chosen"], row["miss"] = False, f"{why}; the recipe's own setting kept"


def tune(recipe_arg: str, overrides: list[str], budget_s: float = 600.0, out: "str | Path | None" = None,
         fresh: bool = False, console: Console | None = None, methods: bool = False, **kw) -> dict:
    """Search the systems settings of a recipe on this machine (see the module doc), then, with
    `methods`, the methods on top of them (hasten.tune.methods); returns the result."""
    console = console or Console(stderr=True)
    recipe = load_recipe(recipe_arg, overrides)
    if recipe.task not in TASKS:
        raise ConfigError(f"hasten tune: unknown task {recipe.task!r}")
    out = Path(out) if out else Path("tune-results") / recipe.name
    outputs = report_outputs(out)
    outputs.check(REPORT_FILES, "choose another --out, or move them away")   # before any trial runs
    outputs.lock("tune output folder")   # a second tune into the same --out is refused while this one runs
    try:
        t0 = time.perf_counter()
        cache = cache_path(recipe_arg, overrides, recipe, kw.get("min_gain", 0.05))
        result = read_cache(cache) if not fresh else None
        if result is not None:
            console.print(f"cached: measured on this machine on {result['date']} (--fresh to measure again)")
        else:
            systems_s = budget_s * SYSTEMS_SHARE if methods else budget_s
            result = Tuner(recipe_arg, overrides, systems_s, out, console, **kw).search()
            cache.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(cache, lambda f: json.dump(result, f, indent=2, default=str), binary=False)
        if methods:
            result = dict(result, methods=_methods(recipe_arg, overrides, recipe, result,
                                                   budget_s - (time.perf_counter() - t0), out, console))
            if result["methods"].get("overrides"):
                result["tuned_overrides"] = list(result["tuned_overrides"]) + result["methods"]["overrides"]
        write(result, outputs)
    finally:
        outputs.unlock()
    return result


def _methods(recipe_arg: str, overrides: list[str], recipe, result: dict, budget_s: float, out: Path, console) -> dict:
    """The method stage on top of the systems settings handed over (hasten.tune.methods)."""
    tuned = result.get("tuned") or result.get("as_written") or {}
    steps = result.get("run_steps")
    if not tuned.get("step_s") or not steps:
        return {"why": "the whole run's length in steps could not be told from the trials (a max_duration in wall-clock "
                       "time?), so a run's cost is unknown", "candidates": [], "left_out": [], "handed_over": []}
    run_s = 1.3 * steps * tuned["step_s"] + 20.0   # ten evaluations and the process's start on top of the steps
    facts = result.get("facts") or {}
    return method_stage(recipe_arg, overrides, result["tuned_overrides"], recipe, facts, budget_s, run_s,
                        steps * recipe.data.batch_size, out, console, TASKS[recipe.task].quality)
