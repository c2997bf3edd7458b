"""Engine: for each event, let algorithms change the state, then let callbacks observe it.

Algorithms run in the order given, except on "after" events (AFTER_* and *_END), where they
run in reverse. The dispatch table is built once; `active` is the set of events somebody
listens to, which the Trainer's loop checks before firing (an idle event costs that look-up).
"""
from __future__ import annotations

from .algorithm import Algorithm
from .callback import _noop
from .event import Event


class Engine:
    def __init__(self, state, logger):
        self.state = state
        self.logger = logger
        self.rebuild()

    def rebuild(self) -> None:
        """Recompute the dispatch table (call after changing state.algorithms or callbacks)."""
        table = {}
        timer = getattr(self, "timer", None)
        for event in Event:
            algos = [(a, getattr(a, event.value), type(a).match is not Algorithm.match)
                     for a in self.state.algorithms if event in a.listens_to()]
            if event.is_after:
                algos.reverse()
            cbs = [getattr(cb, event.value) for cb in self.state.callbacks
                   if getattr(type(cb), event.value, _noop) is not _noop]
            if timer is not None:   # profiling: every event fires, its dispatch timed from start to end
                algos.insert(0, (None, (lambda ev: lambda s, lg: timer.start(ev))(event), False))
                cbs.append((lambda ev: lambda s, lg: timer.end(ev))(event))
            if algos or cbs:
                table[event] = (tuple(algos), tuple(cbs))
        self._table = table
        self.active = frozenset(table)

    def time_events(self, timer) -> None:
        """Fire every event and call `timer.start(event)` before its algorithms and
        `timer.end(event)` after its callbacks (hasten.callbacks.Profile); None stops it."""
        self.timer = timer
        self.rebuild()

    def describe(self) -> str:
        """Who runs at each event, in firing and dispatch order (events nobody listens to
        are left out): what `hasten train --print-events` prints."""
        lines = []
        for event in Event:
            entry = self._table.get(event)
            if entry is None:
                continue
            algos = ", ".join(a.name for a, _, _ in entry[0] if a is not None)
            cbs = ", ".join(type(fn.__self__).__name__ for fn in entry[1] if hasattr(fn, "__self__"))
            lines.append(f"{event.name:<18} " + "; ".join(x for x in (algos and f"algorithms: {algos}",
                                                                     cbs and f"callbacks: {cbs}") if x))
        return "\n".join(lines)

    def run_algorithms(self, event: Event) -> None:
        """The algorithms of `event` only: for an evaluation nobody else is to observe (an
        algorithm comparing two sets of weights before it keeps one)."""
        entry = self._table.get(event)
        if entry is None:
            return
        for algo, fn, conditional in entry[0]:
            if not conditional or algo.match(event, self.state):
                fn(self.state, self.logger)

    def run(self, event: Event) -> None:
        entry = self._table.get(event)
        if entry is None:
            return
        state, logger = self.state, self.logger
        for algo, fn, conditional in entry[0]:
            if not conditional or algo.match(event, state):
                fn(state, logger)
        for fn in entry[1]:
            fn(state, logger)
