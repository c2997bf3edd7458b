"""Assembly, in one room: what turns a model, its loaders and the options into a prepared run.

- options.py: the Trainer's options, each declared once (Durations, StepOptions,
  CheckpointOptions, ParallelOptions); the recipe's `trainer:` section is made of them;
- prepare.py: device, INIT (model surgery), FSDP sharding, optimizers, DDP, compile;
- assembler.py: `assemble`, which makes the Trainer's parts (checkpoint writer and callback,
  which callbacks and loggers run on this rank, the State and engine, the prepared model, the
  resume), and the loading of a checkpoint to start from.
"""
from .assembler import Parts, assemble, checkpoint_io_for, newest_in, on_this_rank, resume_from, runtime_for, start_from
from .options import CheckpointOptions, Durations, ParallelOptions, StepOptions
from .prepare import Prepared, captures_cuda_graphs

__all__ = ["CheckpointOptions", "Durations", "ParallelOptions", "Parts", "Prepared", "StepOptions", "assemble",
           "captures_cuda_graphs", "checkpoint_io_for", "newest_in", "on_this_rank", "resume_from",
           "runtime_for", "start_from"]
