"""Statistics for small samples (3 to 5 runs), without scipy.

- `welch_t_test(a, b)`: Welch's unequal-variance t-test, two-sided p-value.
- `ratio_ci(base, other)`: speedup `base/other` as the ratio of geometric means, with a
  confidence interval from Welch's t-interval on the difference of mean log times. Times
  are positive and roughly log-normal, so the interval is exact under that model; it is wide
  at n = 3, as it should be. With fewer than `MIN_RUNS` runs a side there is no interval
  (with two, a "95%" interval is little more than the spread of four cross-ratios).
- `median_ci(xs)`: a median with its 95% bootstrap interval (many per-step times of one run).
- `t_ppf`, `t_sf`: Student's t distribution through the regularised incomplete beta
  function (continued fraction, Lentz's method).
"""
from __future__ import annotations

import math
import random
import statistics
from statistics import mean, stdev

MIN_RUNS = 3
"""The fewest runs a side from which hasten states an interval (a speedup, a difference): with
fewer, a report lists the runs and gives the point figure only."""


def no_interval_note(n: "tuple[int, int] | list[int]") -> str:
    """What a report says in place of an interval when a side has fewer than MIN_RUNS runs."""
    fewest = min(n)
    return (f" ({fewest} run{'s' if fewest != 1 else ''} a side: no interval, the runs are listed)"
            if fewest < MIN_RUNS else "")


def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbeta) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbeta) * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with df degrees of freedom."""
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2.0, 0.5, x)
    return tail if t >= 0 else 1.0 - tail


def t_ppf(q: float, df: float) -> float:
    """The q-quantile of Student's t (bisection on t_sf)."""
    if not 0.0 < q < 1.0:
        raise ValueError("q must lie in (0, 1)")
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        if 1.0 - t_sf(mid, df) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """(difference of means a - b, its standard error, Welch-Satterthwaite df)."""
    na, nb = len(a), len(b)
    va, vb = stdev(a) ** 2 / na, stdev(b) ** 2 / nb
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va ** 2 / (na - 1) if na > 1 else 0) + (vb ** 2 / (nb - 1) if nb > 1 else 0) or 1e-300)
    return mean(a) - mean(b), se, df


def welch_t_test(a: list[float], b: list[float]) -> dict:
    """Two-sided Welch t-test of mean(a) == mean(b)."""
    if len(a) < 2 or len(b) < 2:
        return {"t": float("nan"), "df": float("nan"), "p": float("nan")}
    diff, se, df = _welch(a, b)
    if se == 0:
        return {"t": float("inf") if diff else 0.0, "df": df, "p": 0.0 if diff else 1.0}
    t = diff / se
    return {"t": t, "df": df, "p": min(1.0, 2.0 * t_sf(abs(t), df))}


def ratio_ci(base: list[float], other: list[float], level: float = 0.95) -> dict:
    """Speedup base/other (ratio of geometric means) with a `level` confidence interval."""
    if not base or not other or min(base + other) <= 0:
        return {"ratio": float("nan"), "low": float("nan"), "high": float("nan"), "n": (len(base), len(other))}
    lb, lo = [math.log(x) for x in base], [math.log(x) for x in other]
    ratio = math.exp(mean(lb) - mean(lo))
    if len(lb) < MIN_RUNS or len(lo) < MIN_RUNS:
        return {"ratio": ratio, "low": float("nan"), "high": float("nan"), "n": (len(base), len(other))}
    diff, se, df = _welch(lb, lo)
    if se == 0:   # every run took exactly the same time: no spread to make an interval from
        return {"ratio": ratio, "low": ratio, "high": ratio, "df": float("nan"), "n": (len(base), len(other))}
    half = t_ppf(0.5 + level / 2, df) * se
    return {"ratio": ratio, "low": math.exp(diff - half), "high": math.exp(diff + half), "df": df,
            "n": (len(base), len(other))}


def describe(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0, "mean": float("nan"), "std": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"n": len(xs), "mean": mean(xs), "std": stdev(xs) if len(xs) > 1 else 0.0, "min": min(xs), "max": max(xs)}


def median_ci(xs: list[float], reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): the median of `xs` and its 95% percentile-bootstrap interval
    (`reps` resamples, seeded: the same numbers give the same interval)."""
    rng = random.Random(seed)
    med = statistics.median(xs)
    boots = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(reps))
    return med, boots[int(0.025 * reps)], boots[int(0.975 * reps) - 1]
