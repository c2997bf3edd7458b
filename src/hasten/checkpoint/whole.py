"""Whole checkpoints: one file per checkpoint, written atomically (temporary file, fsync,
rename), so a failed write (disk full, a signal) leaves the previous file as it was.

`CheckpointIO` is the seam all checkpoint file I/O passes through; the sharded writer
(hasten.checkpoint.sharded) replaces it for sharded runs. Either reads both layouts.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ..errors import CheckpointError
from ..files import atomic_write, os_error_message
from .format import check_payload, load_rest, why_unreadable


class CheckpointIO:
    """Writes and reads one checkpoint file. Writes are atomic: temporary file, fsync, rename;
    a failed write (disk full, a signal) leaves the previous file as it was."""

    suffix = ".pt"   # what this IO writes: a file NAME.pt (a sharded IO writes a folder)
    writes_folder = False   # a checkpoint is a file: save_checkpoint refuses a folder path (a subclass
                            # that writes a folder per checkpoint sets True)
    gathers = True   # a sharded model's state is gathered whole before it is written (rank 0 writes)

    def save(self, payload: dict, path: "str | os.PathLike") -> None:
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CheckpointError(os_error_message(e, path.parent, "creating the checkpoint folder")) from e
        atomic_write(path, lambda f: torch.save(payload, f), error=CheckpointError)

    def load(self, path: "str | os.PathLike") -> dict:
        """The payload of a checkpoint file, or of a sharded checkpoint folder (its model and
        optimizer tensors still in the folder); never runs code from the file."""
        path = Path(path)
        if path.is_dir():
            return load_rest(path)
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint at {path}")
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(
                f"cannot read checkpoint {path}: {why_unreadable(e)}, so it is corrupt, truncated or not a hasten "
                "checkpoint (hasten loads tensors and plain data only, never code from a file). Load an earlier "
                "checkpoint from the same folder.") from e
        return check_payload(payload, path)
