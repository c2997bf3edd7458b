"""Saving a training state, restoring one, and finding the newest checkpoint to resume from.

`save` and `restore` work on a `State` through a CheckpointIO (whole file or sharded folder);
`load_latest` finds the newest checkpoint of a folder that loads, skipping damaged ones.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

from ..errors import CheckpointError
from .format import (NewerFormatError, capture, check_data, list_checkpoints, read_meta, restore_rest,
                     restore_whole_tensors)
from .sharded import restore_tensors
from .whole import CheckpointIO


def save(state, path: "str | os.PathLike", io: CheckpointIO, extra_meta: dict | None = None,
         write: bool = True) -> str:
    """Write a checkpoint of `state` to `path` and record it as the last good one. Raises
    NonFiniteLossError first if a loss since the last check was NaN/Inf: bad weights are
    never saved. With a sharded model every rank calls it (the state is gathered) and only
    the one with `write` (rank 0) writes the file."""
    state.read_train_loss(reset=False)
    gathers = getattr(io, "gathers", True)
    payload = capture(state, extra_meta, whole=gathers)
    if write or not gathers:   # a sharded IO's save is a collective: every rank writes its shards
        io.save(payload, path)
    state.last_checkpoint = str(path)
    return str(path)


def restore(state, payload: dict, strict: bool = True, hyperparameters: str = "checkpoint", path=None) -> dict:
    """Load a payload (whole or sharded) into the state; returns the metadata.

    hyperparameters: 'checkpoint' (the default) keeps the optimizers' settings as the checkpoint
    has them (learning rates, weight decay, momentum: an optimizer's `load_state_dict` restores
    them all); 'run' puts back the settings the optimizers were built with for this run, for a
    resume whose recipe changes them on purpose (`hasten train --resume RUN optimizer.lr=... --force`).
    The schedules' base learning rate (`initial_lr`) follows. A checkpoint of training on other
    data than this run's (a prepared source's manifest, format.check_data) is refused; `path`
    names the checkpoint in messages."""
    if hyperparameters not in ("checkpoint", "run"):
        raise ValueError(f"hyperparameters={hyperparameters!r}: use 'checkpoint' or 'run'")
    where = path or payload.get("sharded_path") or "the checkpoint"
    meta = read_meta(payload, where)
    check_data(state, meta, where)
    built = [[{k: v for k, v in g.items() if k != "params"} for g in o.param_groups] for o in state.optimizers]
    if payload.get("sharded_path"):   # a sharded checkpoint: read its shards into this run's tensors
        restore_tensors(state, payload, meta)
    else:
        restore_whole_tensors(state, payload, meta, strict)
    if hyperparameters == "run":
        for opt, groups in zip(state.optimizers, built):
            for group, settings in zip(opt.param_groups, groups):
                group.update(settings)
                group["initial_lr"] = float(settings.get("initial_lr", settings["lr"]))
    return restore_rest(state, payload, meta)


LISTINGS = 5
"""How often load_latest lists a folder whose checkpoints all vanished before they could be read."""


def load_latest(folder: "str | os.PathLike", io: CheckpointIO | None = None) -> tuple[Path, dict] | None:
    """(path, payload) of the newest checkpoint in `folder` that loads; unreadable ones are
    skipped with a warning. The folder may belong to a run that is still writing (keep_last
    removes the older checkpoints as it saves): one removed between being listed and being read
    is passed over for the next newest, and the folder listed again when every one it listed
    went, LISTINGS times at most; then a one-line CheckpointError says the run is still writing."""
    io = io or CheckpointIO()
    for _ in range(LISTINGS):
        listed, vanished = list(reversed(list_checkpoints(folder))), 0
        for p in listed:
            try:
                return p, io.load(p)
            except NewerFormatError:
                raise   # not damaged: resuming from an older one would throw its progress away
            except FileNotFoundError:
                vanished += 1   # removed since it was listed: a newer one was written
            except CheckpointError as e:
                if not Path(p).exists():
                    vanished += 1
                    continue
                warnings.warn(f"skipping unreadable checkpoint: {e}")
        if not listed or vanished < len(listed):
            return None
    raise CheckpointError(f"the checkpoints in {folder} were replaced faster than they could be read: the run is "
                          "still writing them; wait for it to save, or give one checkpoint file to read")


def find_latest(folder: "str | os.PathLike", io: CheckpointIO | None = None) -> Path | None:
    """The newest checkpoint in `folder` that loads."""
    found = load_latest(folder, io)
    return found[0] if found else None
