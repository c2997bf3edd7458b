"""JSONL logger: one JSON object a flush, {"step": N, "metric": value, ...}; easy to load with pandas.

On resume from a checkpoint at step B, rows of steps after B (written by the run before it
was killed, for steps it is about to train again) are dropped, so each step is written
once; a run that starts over (every checkpoint gone) rewinds to step 0 the same way. Only
rows hasten writes are dropped (a JSON object with a whole-number `step`): any other line in
the file is kept as it is. The first `train/loss` after a resume averages the steps since the
resume point only (the window of losses is not part of a checkpoint).
"""
from __future__ import annotations

import json
import math
import os

from ..files import atomic_write
from .base import LoggerDestination


class JSONLLogger(LoggerDestination):
    def __init__(self, path: str):
        self.path = str(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._f = open(self.path, "a", buffering=1)

    def log_metrics(self, metrics, step):
        row = {"step": step}
        row.update({k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()})
        self._f.write(json.dumps(row) + "\n")

    def resume_at(self, step: int) -> None:
        self._f.close()
        keep, dropped = [], False
        with open(self.path) as f:
            lines = f.readlines()
        for i, line in enumerate(lines):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1 and not line.endswith("\n"):   # a last row torn by a kill
                    dropped = True
                    continue
                row = None
            if isinstance(row, dict) and type(row.get("step")) is int and row["step"] > step:
                dropped = True   # hasten's row of a step the run is about to train again
                continue
            keep.append(line if line.endswith("\n") else line + "\n")
        if dropped:
            atomic_write(self.path, lambda f: f.writelines(keep), binary=False)
        self._f = open(self.path, "a", buffering=1)

    def log_hparams(self, hparams):
        """Nothing: metrics.jsonl holds one row per step and nothing else (readers rely on
        it); a run folder keeps its recipe in recipe.yaml."""

    def close(self):
        if not self._f.closed:
            self._f.close()
