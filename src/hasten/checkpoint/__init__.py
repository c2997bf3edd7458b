"""Checkpoints: atomic save, safe load, autoresume discovery.

- format.py: what a checkpoint holds (capture and restore of a State), names, format checks;
- whole.py: `CheckpointIO`, one file per checkpoint, atomic (the default);
- sharded.py: `ShardedCheckpointIO`, a folder per checkpoint written by every rank through
  torch.distributed.checkpoint (FSDP runs), and `export_whole`;
- saving.py: `save`, `restore`, `load_latest`, `find_latest`.

Loading never runs code from a file (tensors through `weights_only=True`, the rest as JSON).
"""
from ..errors import CheckpointError
from .format import FORMAT, capture, checkpoint_name, list_checkpoints
from .saving import find_latest, load_latest, restore, save
from .sharded import ShardedCheckpointIO, export_whole
from .whole import CheckpointIO

__all__ = ["FORMAT", "CheckpointError", "CheckpointIO", "ShardedCheckpointIO", "capture", "checkpoint_name",
           "export_whole", "find_latest", "list_checkpoints", "load_latest", "restore", "save"]
