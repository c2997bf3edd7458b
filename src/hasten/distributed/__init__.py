"""Training past one process: the world (ranks, process group), stopping together (signals,
lost ranks), FSDP2's options and helpers, sharded tensors. Wrapping a model for a run (DDP,
FSDP) is part of assembling it (hasten.assembly.prepare); sharded checkpoints live with the
other checkpoints (hasten.checkpoint.sharded). See docs/distributed.md."""
from .fsdp import FSDPOptions
from .stop import StopCoordinator
from .world import PARALLELISMS, World, all_sum, join_world, launched_world, leave_worker

__all__ = ["FSDPOptions", "PARALLELISMS", "StopCoordinator", "World", "all_sum", "join_world", "launched_world",
           "leave_worker"]
