"""Checkpoint callback: save at an interval, keep the last N and the best k by a metric.

The Trainer's `save_folder` / `save_interval` create this same callback. A final
checkpoint is always written at the end of fit. An index (checkpoints.json) in the folder
lists what is kept, with the monitored metric.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..checkpoint import CheckpointIO, checkpoint_name, save
from ..core import Callback, Interval, Time


class Checkpoint(Callback):
    def __init__(self, folder: str, interval: "str | Time" = "1ep", keep_last: int | None = 2,
                 keep_best: int = 0, monitor: str | None = None, mode: str = "min",
                 io: CheckpointIO | None = None):
        if keep_best and not monitor:
            raise ValueError("keep_best needs monitor=, the metric to rank checkpoints by (e.g. 'val/loss')")
        if mode not in ("min", "max"):
            raise ValueError(f"mode={mode!r}: use 'min' or 'max'")
        if keep_last is not None and keep_last < 1:
            raise ValueError("keep_last must be >= 1 (or None to keep all)")
        self.folder = Path(folder)
        self.interval = Interval(interval)
        self.keep_last, self.keep_best, self.monitor, self.mode = keep_last, keep_best, monitor, mode
        self.io = io or CheckpointIO()
        self.saved: list[dict] = []   # {"path", "batch", "metric"} oldest first
        self._started = False

    def fit_start(self, state, logger):
        self.interval.start(state.timestamp, state.progress)

    def checkpoint(self, state, logger):
        if self.interval.due(state.timestamp, state.progress, epoch_end=state.at_epoch_end):
            self.save(state)

    def fit_end(self, state, logger):
        if not self.saved or self.saved[-1]["batch"] != state.timestamp.batch:
            self.save(state)

    def save(self, state) -> str:
        state.read_train_loss(reset=False)  # check before recording: never list a checkpoint of bad weights
        path = self.folder / checkpoint_name(state)
        metric = state.eval_metrics.get(self.monitor) if self.monitor else None
        self.saved = [s for s in self.saved if s["path"] != str(path)]
        self.saved.append({"path": str(path), "batch": state.timestamp.batch, "metric": metric})
        save(state, path, self.io)   # the state saved includes self.saved
        self._prune()
        self._write_index()
        return str(path)

    def _keep(self) -> set[str]:
        keep = {s["path"] for s in (self.saved[-self.keep_last:] if self.keep_last else self.saved)}
        if self.keep_best:
            ranked = [s for s in self.saved if s["metric"] is not None]
            ranked.sort(key=lambda s: s["metric"], reverse=self.mode == "max")
            keep |= {s["path"] for s in ranked[: self.keep_best]}
        return keep

    def _prune(self) -> None:
        keep = self._keep()
        for s in [s for s in self.saved if s["path"] not in keep]:
            try:
                os.unlink(s["path"])
            except FileNotFoundError:
                pass
        self.saved = [s for s in self.saved if s["path"] in keep]

    def _write_index(self) -> None:
        data = {"checkpoints": self.saved, "monitor": self.monitor, "best": self.best_path}
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".index.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, self.folder / "checkpoints.json")

    @property
    def best_path(self) -> str | None:
        ranked = [s for s in self.saved if s["metric"] is not None]
        if not ranked:
            return None
        return (min if self.mode == "min" else max)(ranked, key=lambda s: s["metric"])["path"]

    def state_dict(self):
        return {"saved": [dict(s) for s in self.saved]}

    def load_state_dict(self, sd):
        self.saved = [dict(s) for s in sd.get("saved", [])]
