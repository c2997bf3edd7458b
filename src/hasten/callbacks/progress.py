"""ProgressBar: a rich progress bar with throughput, ETA, the last logged loss and eval results.

It redraws at most `refresh_hz` times a second and reads only values already logged, so
it adds no synchronisation to the training step. Where the output is not a terminal (a log
file, CI, `nohup`), a redrawn bar would be one line squeezed to 80 columns at the end; there
it prints a plain line at every tenth of the run instead (`plain_every`), never cut short.
"""
from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..core import Callback, TimeUnit
from ..loggers.base import fmt


class ProgressBar(Callback):
    main_rank_only = True   # under data parallelism, rank 0 alone writes

    def __init__(self, refresh_hz: float = 4.0, console: Console | None = None, plain: bool | None = None,
                 plain_every: float = 0.1):
        if not 0 < plain_every <= 1:
            raise ValueError(f"plain_every={plain_every} must be a fraction of the run in (0, 1]")
        self.period = 1.0 / refresh_hz
        self.console = console or Console(stderr=True, highlight=False)
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self.plain_every = plain_every
        self._progress = None
        self._next = 0.0
        self._printed = -1   # plain mode: the last tenth (of plain_every) printed

    def _total(self, state):
        unit, value = state.max_duration.unit, state.max_duration.value
        if unit == TimeUnit.BATCH:
            return value, "ba"
        if unit == TimeUnit.EPOCH and state.steps_per_epoch:
            return value * state.steps_per_epoch, "ba"
        return 1000, "‰"   # samples, tokens, seconds: show progress in per mille

    def fit_start(self, state, logger):
        total, self._unit = self._total(state)
        self._t0, self._b0 = time.perf_counter(), state.timestamp.batch
        self._s0, self._k0 = state.timestamp.sample, state.timestamp.token
        if self.plain:
            self._total_n, self._p0 = total, state.progress
            self._printed = int(state.progress / self.plain_every + 1e-9)   # a resumed run: from where it is
            self._progress = "plain"
            return
        self._progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[speed]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"), console=self.console, auto_refresh=False, transient=False)
        self._progress.start()
        self._task = self._progress.add_task("train", total=total, speed="", info="")
        self._update(state, logger, force=True)

    def _update(self, state, logger, force=False):
        now = time.perf_counter()
        if not force and now < self._next:
            return
        self._next = now + self.period
        if self.plain:
            return self._plain_line(state, logger, now, final=False)
        ts = state.timestamp
        done = ts.batch if self._unit == "ba" else int(state.progress * 1000)
        speed, info = self._fields(state, logger, now)
        self._progress.update(self._task, completed=done, speed=speed, info=info)
        self._progress.refresh()

    def _fields(self, state, logger, now) -> tuple[str, str]:
        ts = state.timestamp
        dt = max(now - self._t0, 1e-9)
        speed = f"{(ts.batch - self._b0) / dt:.1f} ba/s"
        if ts.token > self._k0:
            speed += f" {(ts.token - self._k0) / dt:,.0f} tok/s"
        else:
            speed += f" {(ts.sample - self._s0) / dt:,.0f} sp/s"
        mfu = logger.latest.get("throughput/mfu")   # SpeedMonitor's, when it knows the FLOPs and the peak
        if mfu is not None:
            speed += f" MFU {100 * mfu:.1f}%"
        if ts.batch > self._b0:   # the share of training time spent waiting for batches: is the loader the bottleneck?
            speed += f" data {100 * state.data_wait:.0f}%"
        shown = {k: v for k, v in logger.latest.items() if k == "train/loss" or k.startswith("val/")}
        info = " ".join(f"{k}={fmt(v)}" for k, v in shown.items())
        return speed, info

    def _plain_line(self, state, logger, now, final: bool) -> None:
        """One line when the run has crossed the next `plain_every` of its length; the end's line
        comes from fit_end, after the last evaluation, so it carries the final figures."""
        p = min(max(state.progress, 0.0), 1.0)
        tenth = int(p / self.plain_every + 1e-9)
        if not final and (tenth <= self._printed or p >= 1.0):
            return
        self._printed = max(tenth, self._printed)
        ts = state.timestamp
        done = f"{ts.batch:,}/{self._total_n:,} ba" if self._unit == "ba" else f"{1000 * p:.0f}/1000 of the run"
        speed, info = self._fields(state, logger, now)
        dt = now - self._t0
        ran = p - self._p0
        eta = f"eta {_clock(dt * (1 - p) / ran)}" if 0 < ran and p < 1 else ""
        parts = ["train", done, f"({100 * p:.0f}%)", speed, f"{_clock(dt)} elapsed", eta, info]
        self.console.print(" ".join(x for x in parts if x), markup=False, highlight=False, soft_wrap=True)

    def batch_end(self, state, logger):
        if time.perf_counter() >= self._next:
            self._update(state, logger)

    def eval_end(self, state, logger):
        if self._progress is not None:
            self._update(state, logger, force=True)

    def fit_end(self, state, logger):
        if self._progress is None:
            return
        if self.plain:   # the last line: the run's end, with the last loss and evaluation
            self._plain_line(state, logger, time.perf_counter(), final=True)
        else:
            self._update(state, logger, force=True)
            self._progress.stop()
        self._progress = None


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"


class LineProgress:
    """The part of rich's `Progress` that bench and tune use, for output that is not a
    terminal: a whole line each time the work moves to a new part (its description changes)
    and one at the end, with the count done, the time elapsed and an estimate of what is left,
    so a long comparison under `nohup` or CI shows where it is."""

    def __init__(self, name: str, console: Console):
        self.name, self.console = name, console
        self._tasks: dict[int, dict] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for t in self._tasks.values():
            if exc[0] is None and t["total"]:
                self._line(t, "done")
        return False

    def add_task(self, description: str, total: float | None = None, **_) -> int:
        i = len(self._tasks)
        self._tasks[i] = {"total": total, "done": 0.0, "t0": time.perf_counter(), "description": None}
        self.update(i, description=description)
        return i

    def advance(self, task: int, advance: float = 1) -> None:
        self._tasks[task]["done"] += advance

    def update(self, task: int, description: str | None = None, advance: float = 0, **_) -> None:
        t = self._tasks[task]
        t["done"] += advance
        if description and description != t["description"]:
            t["description"] = description
            self._line(t, description)

    def _line(self, t: dict, what: str) -> None:
        dt = time.perf_counter() - t["t0"]
        done, total = t["done"], t["total"]
        count = f"[{done:.0f}/{total:.0f}]" if total else ""
        eta = f", eta {_clock(dt * (total - done) / done)}" if total and 0 < done < total else ""
        parts = [self.name, count, f"{what} ({_clock(dt)} elapsed{eta})"]
        self.console.print(" ".join(x for x in parts if x), markup=False, highlight=False, soft_wrap=True)


def work_progress(name: str, console: Console, *columns) -> "Progress | LineProgress":
    """A rich bar named `name` with `columns` after it where `console` is a terminal; whole lines
    (LineProgress) where it is not."""
    if not console.is_terminal:
        return LineProgress(name, console)
    return Progress(TextColumn(f"[bold]{name}"), BarColumn(), *columns, console=console)
