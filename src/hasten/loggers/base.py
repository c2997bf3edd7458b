"""Logging: algorithms and callbacks log into one hub; destinations receive plain floats.

Values may be tensors: the hub keeps them as they are and converts them to floats only
when it flushes, at log points, so logging never forces a host synchronisation per step.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ..errors import HastenError


class LoggerDestination:
    """Where metrics end up (console, JSONL file, TensorBoard)."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_hparams(self, hparams: dict[str, Any]) -> None:
        pass

    def resume_at(self, step: int) -> None:
        """The run continues from a checkpoint at `step`: what was logged after it will be
        logged again by the resumed run. Destinations that can, forget it."""

    def close(self) -> None:
        pass


class LoggerFailed(HastenError):
    """A logger raised and the run was asked to stop on it (on_logger_error='stop')."""


class LogHub:
    """The destinations of one run. A destination that raises (a tracker's server gone, a full
    disk) never stops training by surprise: with `on_error='continue'` (the default) it is
    switched off for the rest of the run with one warning naming it, the step and the error;
    with 'stop' the hub records the failure and calls `on_stop` (the Trainer's request for a
    clean stop: a checkpoint at the end of the step and the command that resumes it); a failure
    before training (log_hparams) is then a LoggerFailed error."""

    def __init__(self, destinations=(), on_error: str = "continue"):
        self.destinations = list(destinations)
        self.on_error = on_error
        self.on_stop = None           # set by the assembler: asks the loop to stop cleanly
        self.failure: str | None = None   # the first failure, for messages
        self._pending: dict[str, Any] = {}
        self.latest: dict[str, float] = {}   # last flushed value of every metric

    def _call(self, what: str, step: "int | None", fn, *args) -> None:
        for d in list(self.destinations):
            try:
                getattr(d, fn)(*args)
            except Exception as e:
                self._failed(d, what, step, e)

    def _failed(self, d, what: str, step: "int | None", e: Exception) -> None:
        self.destinations.remove(d)
        at = f" at step {step}" if step is not None else ""
        line = f"{type(d).__name__} failed {what}{at} ({type(e).__name__}: {str(e).strip()[:200]})"
        self.failure = self.failure or line
        if self.on_error == "stop":
            if self.on_stop is None or what != "logging metrics":   # before training: nothing to checkpoint
                raise LoggerFailed(f"{line}; trainer.on_logger_error is stop") from e
            self.on_stop("logger")
            return
        warnings.warn(f"{line}; training goes on without it: what follows is not logged there "
                      "(trainer.on_logger_error: stop to stop with a checkpoint instead)", stacklevel=3)

    def log(self, metrics: dict[str, Any]) -> None:
        self._pending.update(metrics)

    def log_hparams(self, hparams: dict[str, Any]) -> None:
        self._call("logging the hyperparameters", None, "log_hparams", hparams)

    def flush(self, step: int) -> dict[str, float]:
        if not self._pending:
            return {}
        out = {}
        for k, v in self._pending.items():
            if isinstance(v, torch.Tensor):
                v = v.detach().float().item()
            out[k] = float(v)
        self._pending.clear()
        self.latest.update(out)
        self._call("logging metrics", step, "log_metrics", out, step)
        return out

    def resume_at(self, step: int) -> None:
        self._call("resuming", step, "resume_at", step)

    def close(self) -> None:
        on_error, self.on_error = self.on_error, "continue"   # at the end a failure only warns
        try:
            self._call("closing", None, "close")
        finally:
            self.on_error = on_error


def mapping_problem(options, allowed: dict) -> "str | None":
    """What is wrong with a tracker's options mapping (`allowed`: key -> type), by key; None when
    it is absent or every key is known and of its type."""
    if options is None:
        return None
    if not isinstance(options, dict):
        return f"is not a mapping; give one of {', '.join(allowed)} (or {{}} for the defaults)"
    for key, value in options.items():
        if key not in allowed:
            return f"has an unknown key {key!r}; it takes {', '.join(allowed)}"
        if value is not None and not isinstance(value, allowed[key]):
            return f"has {key}: {value!r}, which is not a {allowed[key].__name__}"
    return None


def fmt(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.3e}"
    return f"{v:.4f}"
