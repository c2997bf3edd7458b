"""Event order, algorithm/callback order, micro-batch events, and the cost of idle events."""
import torch

from hasten import Algorithm, Callback, Event, Trainer
from hasten.core import Engine, State, Time

from tiny import loader, mlp


class Recorder(Callback):
    def __init__(self, log):
        self.log = log


for _e in Event:
    setattr(Recorder, _e.value, (lambda ev: lambda self, state, logger: self.log.append(("cb", ev)))(_e))


class Tagged(Algorithm):
    def __init__(self, tag, log):
        self.tag, self.log = tag, log


for _e in Event:   # listens to every event: one method each
    setattr(Tagged, _e.value, lambda self, state, logger, _e=_e: self.log.append((self.tag, _e)))


def test_fit_fires_events_in_documented_order():
    log = []
    tr = Trainer(mlp(), loader(n=16, batch_size=8), max_duration="2ba", eval_dataloader=loader(n=8, batch_size=8),
                 eval_interval="1ep", callbacks=[Recorder(log)], device="cpu", grad_accum=2)
    tr.fit()
    events = [e for who, e in log if who == "cb"]
    micro = [Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS,
             Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD]
    one_batch = ([Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER, Event.BATCH_START] + micro * 2
                 + [Event.BEFORE_OPTIM_STEP, Event.AFTER_OPTIM_STEP, Event.BATCH_END, Event.CHECKPOINT])
    evaluation = [Event.EVAL_START, Event.EVAL_BATCH_START, Event.EVAL_BATCH_END, Event.EVAL_END]
    expected = ([Event.INIT, Event.FIT_START, Event.EPOCH_START] + one_batch * 2
                + [Event.EPOCH_END] + evaluation + [Event.CHECKPOINT, Event.FIT_END])
    assert events == expected


def test_algorithms_before_callbacks_and_reversed_on_after_events():
    log = []
    state = State(model=mlp(), max_duration=Time.parse("1ba"), device=torch.device("cpu"),
                  algorithms=[Tagged("a1", log), Tagged("a2", log)], callbacks=[Recorder(log)])
    engine = Engine(state, logger=None)
    for ev in (Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BATCH_END, Event.EVAL_END, Event.INIT):
        log.clear()
        engine.run(ev)
        tags = [who for who, _ in log]
        if ev.is_after:
            assert tags == ["a2", "a1", "cb"], ev
        else:
            assert tags == ["a1", "a2", "cb"], ev


def test_after_events_are_the_after_and_end_ones():
    after = {e for e in Event if e.is_after}
    assert Event.AFTER_LOSS in after and Event.BATCH_END in after and Event.FIT_END in after
    assert Event.BEFORE_LOSS not in after and Event.BATCH_START not in after and Event.CHECKPOINT not in after


def test_match_filters_and_idle_events_are_absent_from_the_table():
    class OnlyLoss(Algorithm):
        calls = 0

        def after_loss(self, state, logger):
            OnlyLoss.calls += 1

    state = State(model=mlp(), max_duration=Time.parse("1ba"), device=torch.device("cpu"),
                  algorithms=[OnlyLoss()])
    engine = Engine(state, logger=None)
    assert engine.active == {Event.AFTER_LOSS}
    engine.run(Event.BATCH_END)
    assert OnlyLoss.calls == 0
    engine.run(Event.AFTER_LOSS)
    assert OnlyLoss.calls == 1


def test_callback_without_overrides_listens_to_nothing():
    state = State(model=mlp(), max_duration=Time.parse("1ba"), device=torch.device("cpu"), callbacks=[Callback()])
    assert Engine(state, logger=None).active == frozenset()


def test_adding_callbacks_and_algorithms_and_the_printed_event_plan():
    import pytest
    from hasten import Callback, Trainer
    from hasten.algorithms import EMA, SAM, ChannelsLast, LabelSmoothing, MixUp
    from tiny import loader, mlp

    class Seen(Callback):
        def __init__(self):
            self.n = 0

        def batch_end(self, state, logger):
            self.n += 1

    tr = Trainer(mlp(), loader(), max_duration="3ba", device="cpu", algorithms=[MixUp(), LabelSmoothing(0.1)])
    seen = Seen()
    tr.add_callbacks(seen)
    tr.add_algorithms(EMA(decay=0.5), SAM())
    with pytest.raises(ValueError, match="INIT"):
        tr.add_algorithms(ChannelsLast())
    plan = tr.describe()
    assert "BATCH_END          algorithms: EMA; callbacks: Seen" in plan
    assert "AFTER_DATALOADER   algorithms: MixUp" in plan
    assert "EVAL_END           algorithms: EMA" in plan
    assert "SAM wraps forward/backward" in plan
    assert "training loss = LabelSmoothing(MixUp(task loss))" in plan
    tr.fit()
    assert seen.n == 3


def test_events_are_the_overridden_methods_and_match_is_a_condition():
    log = []

    class Base(Algorithm):
        def batch_end(self, state, logger):
            log.append(("batch_end", state.timestamp.batch))

    class Child(Base):   # inherits batch_end, adds fit_start, only acts on even batches
        def fit_start(self, state, logger):
            log.append(("fit_start", 0))

        def match(self, event, state):
            return event != Event.BATCH_END or state.timestamp.batch % 2 == 0

    assert Base.listens_to() == (Event.BATCH_END,)
    assert Child.listens_to() == (Event.FIT_START, Event.BATCH_END)
    Trainer(mlp(), loader(n=32, batch_size=8), max_duration="4ba", device="cpu", algorithms=[Child()]).fit()
    assert log == [("fit_start", 0), ("batch_end", 2), ("batch_end", 4)]
