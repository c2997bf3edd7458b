"""Logging: algorithms and callbacks log into one hub; destinations receive plain floats.

Values may be tensors: the hub keeps them as they are and converts them to floats only
when it flushes, at log points, so logging never forces a host synchronisation per step.
"""
from __future__ import annotations

import math
from typing import Any

import torch


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


class LogHub:
    def __init__(self, destinations=()):
        self.destinations = list(destinations)
        self._pending: dict[str, Any] = {}
        self.latest: dict[str, float] = {}   # last flushed value of every metric

    def log(self, metrics: dict[str, Any]) -> None:
        self._pending.update(metrics)

    def log_hparams(self, hparams: dict[str, Any]) -> None:
        for d in self.destinations:
            d.log_hparams(hparams)

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
        for d in self.destinations:
            d.log_metrics(out, step)
        return out

    def resume_at(self, step: int) -> None:
        for d in self.destinations:
            d.resume_at(step)

    def close(self) -> None:
        for d in self.destinations:
            d.close()


def fmt(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.3e}"
    return f"{v:.4f}"
