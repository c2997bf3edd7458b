"""EarlyStopping: stop when a monitored metric stops improving, reaches a target, or diverges."""
from __future__ import annotations

import math

from ..core import Callback
from ..errors import ConfigError


class EarlyStopping(Callback):
    """Checked after each evaluation.

    patience: evaluations without an improvement larger than min_delta before stopping.
    stopping_threshold: stop as soon as the metric is at least this good.
    divergence_threshold: stop as soon as the metric is this bad or worse (or non-finite).
    """

    def __init__(self, monitor: str = "val/loss", mode: str = "min", patience: int = 3,
                 min_delta: float = 0.0, stopping_threshold: float | None = None,
                 divergence_threshold: float | None = None):
        if mode not in ("min", "max"):
            raise ValueError(f"mode={mode!r}: use 'min' or 'max'")
        if patience < 1:
            raise ValueError("patience counts evaluations and must be >= 1")
        self.monitor, self.mode, self.patience, self.min_delta = monitor, mode, patience, abs(min_delta)
        self.stopping_threshold, self.divergence_threshold = stopping_threshold, divergence_threshold
        self.best: float | None = None
        self.bad_evals = 0

    def _better(self, a: float, b: float, delta: float = 0.0) -> bool:
        return a < b - delta if self.mode == "min" else a > b + delta

    def eval_end(self, state, logger):
        if self.monitor not in state.eval_metrics:
            raise ConfigError(f"EarlyStopping monitors {self.monitor!r}, but evaluation produced "
                              f"{sorted(state.eval_metrics)}: give monitor= one of those, or add the metric to "
                              "the Trainer's metrics=")
        value = state.eval_metrics[self.monitor]
        reason = None
        if not math.isfinite(value):
            reason = f"{self.monitor} is {value}"
        elif self.divergence_threshold is not None and not self._better(value, self.divergence_threshold):
            reason = f"{self.monitor}={value:.4g} crossed the divergence threshold {self.divergence_threshold}"
        elif self.stopping_threshold is not None and not self._better(self.stopping_threshold, value):
            reason = f"{self.monitor}={value:.4g} reached the stopping threshold {self.stopping_threshold}"
        else:
            if self.best is None or self._better(value, self.best, self.min_delta):
                self.best, self.bad_evals = value, 0
            else:
                self.bad_evals += 1
                if self.bad_evals >= self.patience:
                    reason = f"{self.monitor} did not improve for {self.bad_evals} evaluations (best {self.best:.4g})"
        if reason:
            state.stop_training, state.stop_reason = True, f"early stopping: {reason}"

    def state_dict(self):
        return {"best": self.best, "bad_evals": self.bad_evals}

    def load_state_dict(self, sd):
        self.best, self.bad_evals = sd["best"], sd["bad_evals"]
