"""JSONL logger: one JSON object a flush, {"step": N, "metric": value, ...}; easy to load with pandas."""
from __future__ import annotations

import json
import math
import os

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

    def log_hparams(self, hparams):
        self._f.write(json.dumps({"hparams": hparams}, default=str) + "\n")

    def close(self):
        if not self._f.closed:
            self._f.close()
