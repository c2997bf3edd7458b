"""Moved to hasten.checkpoint.sharded; this name stays for code written against hasten 0.1."""
from .checkpoint.format import load_rest
from .checkpoint.sharded import ShardedCheckpointIO, export_whole, join_tensors, load_sharded, split_tensors

__all__ = ["ShardedCheckpointIO", "export_whole", "join_tensors", "load_rest", "load_sharded", "split_tensors"]
