"""Censored time to target: Kaplan-Meier medians and the bootstrap interval, on synthetic
runs with known misses (a closed-form example and a simulation with a known answer)."""
import math
import random
import statistics

import pytest

from hasten.bench.survival import censored_speedup, describe_speedup, km_median


def test_km_median_by_hand():
    assert km_median([(3.0, True), (1.0, True), (2.0, True)]) == 2.0          # no misses: the median
    # textbook: S = 3/4 after 10; 12 censored leaves 2 at risk; S = 3/4 * 1/2 = 3/8 at 14
    assert km_median([(10.0, True), (12.0, False), (14.0, True), (20.0, True)]) == 14.0
    assert km_median([(10.0, True), (15.0, False), (15.0, False)]) is None     # two of three never reach it
    # a miss at the same time as a hit: the hit happens first (the missed run was still at risk)
    assert km_median([(5.0, False), (5.0, True), (9.0, True)]) == 9.0
    assert km_median([]) is None


def test_speedup_with_misses_is_open_ended_not_hidden():
    base = [(10.0, True), (15.0, False), (15.0, False)]        # the baseline mostly misses
    fast = [(4.0, True), (5.0, True), (6.0, True)]
    s = censored_speedup(base, fast)
    assert s["ratio"] is None and s["bound"] == ">" and s["ratio_bound"] == pytest.approx(15.0 / 5.0)
    assert s["high"] == math.inf and s["reached"] == [1, 3] and s["runs"] == [3, 3]
    assert describe_speedup(s).startswith("> 3.000x [") and describe_speedup(s).endswith("inf)")
    s = censored_speedup(fast, base)                           # and the other way round
    assert s["ratio"] is None and s["bound"] == "<" and s["low"] == 0.0


def test_no_misses_gives_the_ratio_of_medians_and_a_sane_interval():
    base, fast = [(10.0, True), (11.0, True), (12.0, True)], [(5.0, True), (5.5, True), (6.0, True)]
    s = censored_speedup(base, fast)
    assert s["ratio"] == pytest.approx(2.0)
    assert s["low"] == pytest.approx(10.0 / 6.0) and s["high"] == pytest.approx(12.0 / 5.0)


def test_simulated_benches_with_known_misses():
    """True times log-normal (baseline median 10 s, fast median 5 s: a true speedup of 2);
    a baseline run trained for 11 s, so about a third of them miss and are censored at 11 s.
    Dropping the misses makes the baseline look faster than it is; the Kaplan-Meier median
    is not fooled, and its interval covers the true speedup most of the time."""
    rng = random.Random(1)
    km, dropped, covered = [], [], 0
    trials = 300
    for _ in range(trials):
        base_t = [10.0 * math.exp(rng.gauss(0, 0.25)) for _ in range(5)]
        fast_t = [5.0 * math.exp(rng.gauss(0, 0.25)) for _ in range(5)]
        base = [(t, True) if t <= 11.0 else (11.0, False) for t in base_t]
        fast = [(t, True) for t in fast_t]
        s = censored_speedup(base, fast, resamples=400)
        km.append(s["ratio"] if s["ratio"] is not None else s["ratio_bound"])
        covered += s["low"] <= 2.0 <= s["high"]
        reached = [t for t, r in base if r]
        if reached:
            dropped.append(statistics.median(reached) / statistics.median(fast_t))
    assert 1.85 <= statistics.median(km) <= 2.15
    assert statistics.median(dropped) < 1.85            # the bias that dropping misses brings
    assert covered / trials >= 0.85
