"""ProgressBar: a rich progress bar with throughput, ETA, the last logged loss and eval results.

It redraws at most `refresh_hz` times a second and reads only values already logged, so
it adds no synchronisation to the training step.
"""
from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..core import Callback, TimeUnit
from ..loggers.base import fmt


class ProgressBar(Callback):
    main_rank_only = True   # under data parallelism, rank 0 alone writes

    def __init__(self, refresh_hz: float = 4.0, console: Console | None = None):
        self.period = 1.0 / refresh_hz
        self.console = console or Console(stderr=True, highlight=False)
        self._progress = None
        self._next = 0.0

    def _total(self, state):
        unit, value = state.max_duration.unit, state.max_duration.value
        if unit == TimeUnit.BATCH:
            return value, "ba"
        if unit == TimeUnit.EPOCH and state.steps_per_epoch:
            return value * state.steps_per_epoch, "ba"
        return 1000, "‰"   # samples, tokens, seconds: show progress in per mille

    def fit_start(self, state, logger):
        total, self._unit = self._total(state)
        self._progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[speed]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"), console=self.console, auto_refresh=False, transient=False)
        self._progress.start()
        self._task = self._progress.add_task("train", total=total, speed="", info="")
        self._t0, self._b0 = time.perf_counter(), state.timestamp.batch
        self._s0, self._k0 = state.timestamp.sample, state.timestamp.token
        self._update(state, logger, force=True)

    def _update(self, state, logger, force=False):
        now = time.perf_counter()
        if not force and now < self._next:
            return
        self._next = now + self.period
        ts = state.timestamp
        done = ts.batch if self._unit == "ba" else int(state.progress * 1000)
        dt = max(now - self._t0, 1e-9)
        speed = f"{(ts.batch - self._b0) / dt:.1f} ba/s"
        if ts.token > self._k0:
            speed += f" {(ts.token - self._k0) / dt:,.0f} tok/s"
        else:
            speed += f" {(ts.sample - self._s0) / dt:,.0f} sp/s"
        mfu = logger.latest.get("throughput/mfu")   # SpeedMonitor's, when it knows the FLOPs and the peak
        if mfu is not None:
            speed += f" MFU {100 * mfu:.1f}%"
        shown = {k: v for k, v in logger.latest.items() if k == "train/loss" or k.startswith("val/")}
        info = " ".join(f"{k}={fmt(v)}" for k, v in shown.items())
        self._progress.update(self._task, completed=done, speed=speed, info=info)
        self._progress.refresh()

    def batch_end(self, state, logger):
        if time.perf_counter() >= self._next:
            self._update(state, logger)

    def eval_end(self, state, logger):
        if self._progress is not None:
            self._update(state, logger, force=True)

    def fit_end(self, state, logger):
        if self._progress is not None:
            self._update(state, logger, force=True)
            self._progress.stop()
            self._progress = None
