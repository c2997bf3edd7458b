"""Time to target with misses: runs that never reach the target are censored, not dropped.

A run that reaches the target gives an event at its time to target; a run that misses, or
is stopped by `--cap`, gives a right-censored time: it would have taken at least its whole
timed duration. Dropping such runs makes a recipe that sometimes misses look faster than
it is (its slowest runs are the ones dropped).

- `km_median(runs)`: the Kaplan-Meier estimate of the median time to target, from
  (time, reached) pairs. None when the estimated chance of having reached the target never
  falls to one half (more than half the runs effectively missed): the median is then only
  known to exceed the longest time observed.
- `censored_speedup(base, other)`: the speedup as the ratio of Kaplan-Meier medians,
  base / other, with a percentile bootstrap interval (runs resampled with replacement
  within each recipe, a fixed seed so reports are reproducible). A resample where the
  other recipe's median is undefined counts as an arbitrarily small speedup, one where the
  base's is undefined as an arbitrarily large one, so the interval can be open-ended
  ("> x" or "< x") and never hides a miss.

With no misses the point estimate is the ratio of ordinary medians. With 3 runs per recipe
the bootstrap interval is coarse (a median of 3 resampled runs is one of the 3 runs); it
is stated as what it is, not as an exact interval. With fewer than 3 runs a side
(stats.MIN_RUNS) there is none: the report lists the runs.
"""
from __future__ import annotations

import math
import random
from typing import Sequence

from .stats import MIN_RUNS, no_interval_note

Run = tuple[float, bool]   # (seconds: to the target if reached, else the whole timed run; reached?)


def km_median(runs: Sequence[Run]) -> float | None:
    """Kaplan-Meier median of time to target; None when it is not reached by half."""
    at_risk, surv = len(runs), 1.0
    if not at_risk:
        return None
    # events before censorings at equal times (a run censored at t was still at risk at t)
    for t, reached in sorted(runs, key=lambda r: (r[0], not r[1])):
        if reached:
            surv *= 1.0 - 1.0 / at_risk
            if surv <= 0.5 + 1e-12:
                return t
        at_risk -= 1
    return None


def censored_speedup(base: Sequence[Run], other: Sequence[Run], level: float = 0.95,
                     resamples: int = 4000, seed: int = 0) -> dict:
    """Speedup base/other of Kaplan-Meier median times to target, with a bootstrap interval.

    Returns ratio (None when a median is undefined; then `bound` says which side is known:
    '>' the speedup exceeds `ratio_bound`, '<' it is below it), low and high (0 and inf
    stand for open ends), and the runs reached / total of each side."""
    out = {"method": "Kaplan-Meier median ratio, percentile bootstrap", "level": level,
           "reached": [sum(r for _, r in base), sum(r for _, r in other)], "runs": [len(base), len(other)],
           "ratio": None, "bound": None, "ratio_bound": None, "low": float("nan"), "high": float("nan")}
    if not base or not other:
        return out
    mb, mo = km_median(base), km_median(other)
    few = len(base) < MIN_RUNS or len(other) < MIN_RUNS   # too few runs for an interval (stats.MIN_RUNS)
    longest_b, longest_o = max(t for t, _ in base), max(t for t, _ in other)
    if mb is not None and mo is not None:
        out["ratio"] = mb / mo
    elif mb is None and mo is not None:
        out["bound"], out["ratio_bound"] = ">", longest_b / mo
    elif mb is not None:
        out["bound"], out["ratio_bound"] = "<", mb / longest_o
    rng = random.Random(seed)
    ratios = []
    for _ in range(0 if few else resamples):
        b = km_median([base[rng.randrange(len(base))] for _ in base])
        o = km_median([other[rng.randrange(len(other))] for _ in other])
        if b is None and o is None:
            continue   # neither reaches: no information on the ratio in this resample
        ratios.append(math.inf if o is not None and b is None else 0.0 if o is None else b / o)
    if ratios:
        ratios.sort()
        alpha = (1.0 - level) / 2
        out["low"] = ratios[int(math.floor(alpha * (len(ratios) - 1)))]
        out["high"] = ratios[int(math.ceil((1.0 - alpha) * (len(ratios) - 1)))]
    return out


def describe_speedup(s: dict | None) -> str:
    """'2.990x [2.070, 4.320]', '> 1.8x [1.2, inf)', '1.530x (2 runs a side: no interval, the runs are
    listed)', or '–'."""
    if not s:
        return "–"
    def end(x):
        return "inf" if x == math.inf else f"{x:.3f}"
    if s["ratio"] is not None:
        point = f"{s['ratio']:.3f}x"
    elif s["bound"]:
        point = f"{s['bound']} {s['ratio_bound']:.3f}x"
    else:
        point = "neither reached by half"
    if math.isnan(s["low"]):
        return point + no_interval_note(s.get("runs") or [MIN_RUNS])
    return f"{point} [{end(s['low'])}, {end(s['high'])}" + (")" if s["high"] == math.inf else "]")
