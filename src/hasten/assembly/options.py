"""The Trainer's options, each declared once, in the group that owns it: its type, its range
and its docstring. The Trainer's keywords make these groups; the recipe's `trainer:` section is
made of their fields (hasten.config.TrainerConfig, `hasten.schema.recipe_section`); the
checks run where the group is made, so a recipe and a Python call are refused alike.

- `Durations`: how long to train, how often to evaluate and log (typed time), and what a
  failing logger does;
- `StepOptions`: how one optimizer step is computed (accumulation, clipping, compilation,
  micro-batches, activation checkpointing, the batch contract);
- `CheckpointOptions`: where and how often to save, what to start from;
- `ParallelOptions`: how the model is wrapped under data parallelism.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Union

from ..core.time import Time, TimeUnit
from ..data.batches import inputs_targets, token_count
from ..distributed.fsdp import FSDPOptions
from ..errors import ConfigError
from ..microbatch import size_problem
from ..schema import check_arguments, setting


def _whole_run(value) -> "str | None":
    try:
        fraction = Time.parse(value).unit == TimeUnit.DURATION
    except (TypeError, ValueError):
        return None   # the typed-time check says what is wrong
    return "is a fraction of the run; give ep, ba, sp, tok or s/m/h" if fraction else None


def _clip_norm(value) -> "str | None":
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return None if ok else "give the largest gradient norm, a number > 0, or None for no clipping"


def _microbatch(value) -> "str | None":
    ok = value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
    return None if ok else "give a whole number of samples >= 1, or 'auto'"


@dataclass(frozen=True)
class Durations:
    """How long to train and how often to evaluate and log, in typed time, and what a logger
    that fails does to the run."""
    max_duration: Union[str, Time] = setting("1ep", time=True, check=_whole_run)
    """Length of the run in typed time: ep, ba, sp, tok, or wall-clock s/m/h (not dur)."""
    eval_interval: Union[str, Time] = setting("1ep", interval=True)
    """How often to evaluate (typed time; dur fractions allowed)."""
    log_interval: Union[str, Time] = setting("50ba", interval=True)
    """How often to log the training loss and throughput (typed time)."""
    on_logger_error: Literal["continue", "stop"] = "continue"
    """A logger that raises (a tracker's server gone): continue: train on without it, with one warning; stop: stop cleanly with a checkpoint and the command that resumes."""

    def __post_init__(self):
        check_arguments(self)


@dataclass(frozen=True)
class StepOptions:
    """How one optimizer step is computed."""
    grad_accum: int = setting(1, ge=1)
    """Split each batch into this many micro-batches (the same step as one large batch)."""
    grad_clip_norm: Optional[float] = setting(None, gt=0, check=_clip_norm)
    """Clip the global gradient norm to this value (adds a GradientClipping algorithm)."""
    compile: Union[bool, dict[str, Any]] = False
    """Run the forward pass under torch.compile (a mapping: torch.compile's keyword arguments)."""
    compile_optimizer: Union[bool, dict[str, Any]] = False
    """Run each optimizer's step under torch.compile, learning rates held as tensors so schedules do not recompile it (fewer launches and less host time a step on a GPU; see docs/trainer.md)."""
    microbatch: Union[int, Literal["auto"], None] = setting(None, check=_microbatch)
    """Compute each step in micro-batches of this many samples (the same step, less memory), or auto: halve and redo a step that runs out of memory (not with grad_accum)."""
    memory_limit: Union[int, str, None] = setting(None, check=size_problem)
    """Out of memory on a CPU: the bytes of activations one micro-batch may save for backward (e.g. 512MB); what microbatch=auto reacts to there."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward pass instead of keeping them (less memory, more time); with or without FSDP."""
    batch_fn: Callable = setting(inputs_targets, recipe=False)
    """batch -> (inputs, targets)."""
    count_tokens: Callable = setting(token_count, recipe=False)
    """A step's targets -> its token count (the clock's tokens)."""

    def __post_init__(self):
        for name in ("compile", "compile_optimizer"):   # the most common slip: a string for a switch
            value = getattr(self, name)
            if not isinstance(value, (bool, dict)):
                raise TypeError(f"{name}={value!r}: give True, False, or a dict of torch.compile's arguments, "
                                "e.g. {'mode': 'max-autotune'}")
        check_arguments(self)
        if self.microbatch is not None and self.grad_accum != 1:
            raise ConfigError(f"give grad_accum ({self.grad_accum}) or microbatch ({self.microbatch!r}), not both: "
                              "microbatch sets the accumulation from the batch size")


@dataclass(frozen=True)
class CheckpointOptions:
    """Where and how often to save, and what to start from."""
    save_interval: Union[str, Time, None] = setting(None, interval=True)
    """How often to write a checkpoint; default: at the evaluation points (eval_interval)."""
    keep_last: Optional[int] = setting(2, ge=1)
    """How many of the run's latest checkpoints to keep (null: all)."""
    autoresume: bool = False
    """Continue from the newest checkpoint in the run's checkpoint folder (hasten train --resume RUN_DIR sets it)."""
    load_path: Optional[str] = None
    """Start from this checkpoint, or the latest in a run folder or a folder of checkpoints, or a Hugging Face save_pretrained folder; the run gets its own folder."""
    load_mode: Literal["full", "weights"] = "full"
    """full: the checkpoint's weights, optimizer and clock; weights: only the model's tensors that fit by name and shape (fine-tuning from another task's run)."""
    load_min_share: float = setting(0.5, ge=0.0, le=1.0)
    """A start from weights only (load_mode weights, a save_pretrained folder): the least share of the model's parameters the file must fill, or it is refused (0: any partial load, at least one tensor)."""
    save_folder: Optional[str] = setting(None, recipe=False)
    """Write checkpoints here (a Checkpoint callback is made); a recipe's go to RUN/checkpoints."""
    io: Any = setting(None, recipe=False)
    """The CheckpointIO that writes and reads them; default: one file each (a folder of shards under sharded FSDP)."""
    hyperparameters: Literal["checkpoint", "run"] = setting("checkpoint", recipe=False)
    """On resume, the optimizers' settings: the checkpoint's, or 'run': as built for this run (a forced change)."""

    def __post_init__(self):
        check_arguments(self)


@dataclass(frozen=True)
class ParallelOptions:
    """How the model is wrapped under data parallelism (the world itself is the runtime's)."""
    sync_batchnorm: bool = False
    """Under ddp: batch norm over the whole global batch (torch SyncBatchNorm, CUDA only); off: each rank's share (ghost batch norm)."""
    fsdp: FSDPOptions = field(default_factory=FSDPOptions)
    """Sharded training's settings (trainer.fsdp.*), read under parallelism=fsdp."""

    def __post_init__(self):
        object.__setattr__(self, "fsdp", FSDPOptions.of(self.fsdp))   # a dict of its fields is taken too
        check_arguments(self)
