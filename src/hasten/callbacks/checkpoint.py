"""Checkpoint callback: save at an interval, keep the last N and the best k by a metric,
and delete only what it can prove is its own.

The Trainer's `save_folder` / `save_interval` create this same callback. A final
checkpoint is always written at the end of fit.

Ownership (docs/reliability.md). The folder's index, `checkpoints.json`, lists every
checkpoint written there, each under the id of the run that wrote it. A run deletes a
checkpoint only when all of these hold: it is a direct child of this folder with a
checkpoint's name (`epE-baB.pt`, or a sharded `epE-baB.dcp` folder), it is no symbolic link,
and the folder's own index lists it under this run's id. A run gets its id when it starts;
it keeps the id of the checkpoint it resumes only when that checkpoint lies in this folder
and the index lists it under that id. Paths stored inside a loaded checkpoint are never
read, so loading a checkpoint cannot widen what may be deleted. While a run writes the
folder it holds the folder's lock: a second process is refused, and leftover temporaries
of an earlier run killed mid-save are removed.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import uuid
from pathlib import Path

from ..checkpoint import CheckpointIO, checkpoint_name, save
from ..core import Callback, Interval, Time
from ..errors import RunFolderError
from ..files import FolderLock, atomic_write, ensure_writable_dir

INDEX = "checkpoints.json"
INDEX_FORMAT = 2
ENTRY = re.compile(r"^ep\d+-ba\d+\.(pt|dcp)$")          # what a checkpoint may be called
TEMPORARY = re.compile(r"^\.(ep\d+-ba\d+\.(pt|dcp)|checkpoints\.json)\..+\.tmp$")   # atomic writes' leftovers


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def read_index(folder: "str | os.PathLike") -> list[dict]:
    """The index's entries ({"name", "run", "batch", "metric"}), oldest first. Entries that
    do not name a checkpoint of this folder, and indexes of older hasten versions (which
    stored paths), give nothing: what they list is never deleted."""
    path = Path(folder) / INDEX
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
        return []
    out = []
    for e in data.get("checkpoints", []):
        if (isinstance(e, dict) and isinstance(e.get("name"), str) and ENTRY.match(e["name"])
                and isinstance(e.get("run"), str) and isinstance(e.get("batch"), int)):
            out.append({"name": e["name"], "run": e["run"], "batch": e["batch"], "metric": e.get("metric")})
    return out


def remove_owned(folder: Path, name: str) -> bool:
    """Remove checkpoint `name` from `folder`: a regular file or a real folder with a
    checkpoint's name, directly in `folder`; never a symbolic link or what it points to."""
    if not ENTRY.match(name):
        return False
    path = folder / name
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISREG(mode):
        os.unlink(path)
    elif stat.S_ISDIR(mode):
        shutil.rmtree(path)   # removes links inside, never follows them
    else:
        return False
    return True


class Checkpoint(Callback):
    """Under data parallelism rank 0 alone writes. With a sharded model (FSDP) the Trainer runs
    this callback on every rank, since gathering the model for a checkpoint takes them all;
    only rank 0 touches the folder."""
    main_rank_only = True

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
        self.run_id: str | None = None
        self._saved_at: int | None = None   # the batch this fit last saved (or resumed) at, on every rank
        self.saved: list[dict] = []    # this run's entries in the index, oldest first
        self._others: list[dict] = []  # entries of other runs: kept in the index, never touched
        self._lock = FolderLock(self.folder, "checkpoint folder")

    # ------------------------------------------------------------------ the folder
    def claim(self, state) -> None:
        """Take the folder for this run: check it is writable, lock it, remove leftover
        temporaries, read the index and settle this run's id. Called at fit start (and by
        the Trainer before its first save); a second call does nothing."""
        if self._lock.held:
            return
        ensure_writable_dir(self.folder, "checkpoint folder")
        self._lock.acquire()
        for p in self.folder.iterdir():
            if TEMPORARY.match(p.name) and not p.is_symlink():   # only a killed save of ours leaves these
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        entries = read_index(self.folder)
        resumed = state.resumed_from or {}
        rid = resumed.get("run_id")
        in_folder = resumed.get("path") and Path(resumed["path"]).resolve().parent == self.folder.resolve()
        if self.run_id is None:
            listed = in_folder and any(e["run"] == rid and e["name"] == Path(resumed["path"]).name for e in entries)
            self.run_id = rid if listed else new_run_id()
        owned = {e["name"] for e in entries if e["run"] == self.run_id}
        if not in_folder:
            foreign = sorted(p.name for p in self.folder.iterdir() if ENTRY.match(p.name) and p.name not in owned)
            if foreign:
                self.release()
                raise RunFolderError(
                    f"the checkpoint folder {self.folder} already holds checkpoints of another run "
                    f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); resume that run "
                    "(autoresume) or give this run a folder of its own. hasten neither overwrites nor "
                    "deletes another run's checkpoints.")
        self.saved = [e for e in entries if e["run"] == self.run_id]
        self._others = [e for e in entries if e["run"] != self.run_id]

    def release(self) -> None:
        self._lock.release()

    # ------------------------------------------------------------------ events
    @staticmethod
    def _writes(state) -> bool:
        """Whether this process writes the folder (rank 0, or the only process)."""
        world = getattr(state.runtime, "world", None)
        return world is None or world.is_main

    def fit_start(self, state, logger):
        if self._writes(state):
            self.claim(state)
        resumed = (state.resumed_from or {}).get("path")
        here = resumed and Path(resumed).resolve().parent == self.folder.resolve()
        self._saved_at = state.timestamp.batch if here else None   # a run resumed here needs no save at once
        self.interval.start(state.timestamp, state.progress)

    def checkpoint(self, state, logger):
        if self.interval.due(state.timestamp, state.progress, epoch_end=state.at_epoch_end):
            self.save(state)

    def fit_end(self, state, logger):
        if self._saved_at != state.timestamp.batch:   # decided alike on every rank
            self.save(state)
        self.release()

    def save(self, state) -> str:
        writes = self._writes(state)
        if writes:
            self.claim(state)
        state.read_train_loss(reset=False)  # check before recording: never list a checkpoint of bad weights
        name = checkpoint_name(state)
        if self.io.suffix != ".pt":
            name = name[:-3] + self.io.suffix
        path = self.folder / name
        if writes and os.path.lexists(path) and name not in {s["name"] for s in self.saved}:
            raise RunFolderError(f"{path} exists and belongs to another run; hasten does not overwrite it. "
                                 "Move it away, or give this run a checkpoint folder of its own.")
        metric = state.eval_metrics.get(self.monitor) if self.monitor else None
        save(state, path, self.io, {"run_id": self.run_id}, write=writes)   # a collective under FSDP
        self._saved_at = state.timestamp.batch
        if not writes:
            return str(path)
        self.saved = [s for s in self.saved if s["name"] != name]
        self.saved.append({"name": name, "run": self.run_id, "batch": state.timestamp.batch, "metric": metric})
        self._write_index()      # the new checkpoint is recorded before anything is pruned
        if self._prune():
            self._write_index()
        return str(path)

    # ------------------------------------------------------------------ keep and prune
    def _keep(self) -> set[str]:
        keep = {s["name"] for s in (self.saved[-self.keep_last:] if self.keep_last else self.saved)}
        if self.keep_best:
            ranked = [s for s in self.saved if s["metric"] is not None]
            ranked.sort(key=lambda s: s["metric"], reverse=self.mode == "max")
            keep |= {s["name"] for s in ranked[: self.keep_best]}
        return keep

    def _prune(self) -> bool:
        """Remove this run's checkpoints that are neither among the last N nor the best k;
        True when the index changed."""
        keep = self._keep()
        for s in self.saved:
            if s["name"] not in keep:
                remove_owned(self.folder, s["name"])
        before = len(self.saved)
        self.saved = [s for s in self.saved if s["name"] in keep]
        return len(self.saved) != before

    def _write_index(self) -> None:
        best = self.best_path
        data = {"format": INDEX_FORMAT, "checkpoints": self._others + self.saved, "monitor": self.monitor,
                "best": Path(best).name if best else None}
        atomic_write(self.folder / INDEX, lambda f: json.dump(data, f, indent=1), binary=False)

    @property
    def best_path(self) -> str | None:
        ranked = [s for s in self.saved if s["metric"] is not None]
        if not ranked:
            return None
        return str(self.folder / (min if self.mode == "min" else max)(ranked, key=lambda s: s["metric"])["name"])

    def state_dict(self):
        return {}   # the folder's index, not the checkpoint, says what this run owns

    def load_state_dict(self, sd):
        pass        # older checkpoints stored paths here: they are ignored on purpose
