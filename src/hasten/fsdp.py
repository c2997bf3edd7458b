"""Moved to hasten.distributed.fsdp; this name stays for code written against hasten 0.1."""
from .distributed.fsdp import (FSDPOptions, fsdp_blocks, load_model_state, load_optimizer_state, mixed_precision,
                               model_state, optimizer_state, shard_model)

__all__ = ["FSDPOptions", "fsdp_blocks", "load_model_state", "load_optimizer_state", "mixed_precision", "model_state",
           "optimizer_state", "shard_model"]
