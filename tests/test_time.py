import pytest

from hasten import Time, TimeUnit, Timestamp
from hasten.core import Interval


@pytest.mark.parametrize("text,value,unit", [
    ("10ep", 10, TimeUnit.EPOCH), ("500ba", 500, TimeUnit.BATCH), ("2e6tok", 2_000_000, TimeUnit.TOKEN),
    ("64sp", 64, TimeUnit.SAMPLE), ("0.5dur", 0.5, TimeUnit.DURATION), ("90s", 90.0, TimeUnit.SECOND),
    ("5m", 300.0, TimeUnit.SECOND), ("1h", 3600.0, TimeUnit.SECOND), (" 1.5e3ba ", 1500, TimeUnit.BATCH)])
def test_parse(text, value, unit):
    t = Time.parse(text)
    assert t.value == value and t.unit == unit


@pytest.mark.parametrize("bad", ["10", "ep", "1.5ep", "-1ba", "2dur", "10 epochs", "1e400s"])
def test_parse_rejects(bad):
    with pytest.raises(ValueError):
        Time.parse(bad)


def test_compare_same_unit_only():
    assert Time.parse("10ba") < Time.parse("20ba")
    assert Time.parse("1m") == Time.parse("60s")
    with pytest.raises(ValueError, match="units differ"):
        Time.parse("1ep") < Time.parse("10ba")
    assert str(Time.parse("2e6tok")) == "2000000tok"


def _walk(interval, batches, samples_per_batch=10, tokens_per_batch=0, total=None):
    ts, fired = Timestamp(), []
    interval.start(ts, 0.0)
    for b in range(1, batches + 1):
        ts.batch, ts.sample, ts.token = b, b * samples_per_batch, b * tokens_per_batch
        if interval.due(ts, b / total if total else 0.0):
            fired.append(b)
    return fired


def test_interval_units():
    assert _walk(Interval("3ba"), 10) == [3, 6, 9]
    assert _walk(Interval("25sp"), 10) == [3, 5, 8, 10]        # crossings of 25, 50, 75, 100 samples
    assert _walk(Interval("0.25dur"), 8, total=8) == [2, 4, 6, 8]
    assert _walk(Interval("64tok"), 4, tokens_per_batch=40) == [2, 4]


def test_interval_epochs_and_resume():
    iv = Interval("2ep")
    ts = Timestamp()
    iv.start(ts, 0)
    fired = []
    for e in range(1, 7):
        ts.epoch = e
        assert not iv.due(ts, 0, epoch_end=False)
        if iv.due(ts, 0, epoch_end=True):
            fired.append(e)
    assert fired == [2, 4, 6]
    # after a resume at batch 7, a 3ba interval fires at 9, not at once
    iv = Interval("3ba")
    ts = Timestamp(batch=7)
    iv.start(ts, 0)
    hits = []
    for b in range(8, 13):
        ts.batch = b
        if iv.due(ts, 0):
            hits.append(b)
    assert hits == [9, 12]


def test_typed_time_or_a_bare_fraction_for_the_algorithms_that_took_fractions():
    """ProgressiveResizing, SWA, LayerFreezing and InfoBatch take typed time; a bare number
    stays the shorthand for a fraction of the run."""
    import pytest
    from hasten import Trainer
    from hasten.algorithms import SWA, InfoBatch, LayerFreezing, ProgressiveResizing
    from hasten.core import as_time
    from tiny import loader, mlp

    assert as_time(0.25) == Time(0.25, "dur") and as_time("30ba") == Time(30, "ba")
    with pytest.raises(ValueError, match="fraction of the run"):
        as_time(1.5)
    with pytest.raises(ValueError, match="fraction of the run"):
        as_time("1.5dur")
    # the same point of a 16-batch run, as a fraction and in batches
    for start in (0.5, "8ba", "0.5dur", "1ep"):
        lf = LayerFreezing(start=start, fraction=1.0)
        tr = Trainer(mlp(), loader(n=64, batch_size=8), max_duration="16ba", device="cpu", algorithms=[lf])
        tr.fit()
        assert tr.state.fraction_of(lf.start) == 0.5, start
        assert lf.frozen > 0
    swa = SWA(start="12ba", bn_batches=0)
    Trainer(mlp(), loader(n=64, batch_size=8), max_duration="16ba", device="cpu", algorithms=[swa]).fit()
    assert swa.n_averaged == 4   # batches 13..16
    pr = ProgressiveResizing(start="0ba", finish="2ep")
    assert (pr.start, pr.finish) == (Time(0, "ba"), Time(2, "ep"))
    assert InfoBatch(delta="7ep").delta == Time(7, "ep")
    with pytest.raises(ValueError, match="prune_ratio"):
        InfoBatch(prune_ratio=1.0)
