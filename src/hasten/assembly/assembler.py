"""The one assembler: from a model, its data and a few grouped options to the parts a
Trainer trains with. `hasten train` (build.py), `hasten compress` and a Python user's
`Trainer(...)` all come through `assemble`; the Trainer itself only trains.

In order: the runtime's seed again (the training stream does not depend on how much
randomness building the model took), the model (a factory is called now), clipping as an
algorithm, checkpoint writer and callback, the State, loggers and engine, then
`hasten.distributed.prepare` (device, INIT, wrapping, optimizers), the stop coordinator, and
last the checkpoint to resume from.

The grouped options:
- `Durations`: how long to train, how often to evaluate and log (typed time);
- `StepOptions`: grad accumulation, gradient clipping, compilation, the batch contract;
- `CheckpointOptions`: where and how often to save, what to load or resume;
- `ParallelOptions` (hasten.distributed.prepare): SyncBatchNorm, FSDP's options.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from .algorithms.gradient_clipping import GradientClipping
from .arguments import check_arguments, listed
from .callbacks.checkpoint import INDEX, Checkpoint
from .checkpoint import CheckpointIO, ShardedCheckpointIO, find_latest, load_latest, restore
from .checkpoint.format import REST, load_weights
from .core import Engine, Interval, State, Time, TimeUnit
from .data.batches import inputs_targets, token_count
from .distributed.fsdp import FSDPOptions
from .distributed.prepare import ParallelOptions, Prepared, prepare
from .distributed.stop import StopCoordinator
from .errors import CheckpointError
from .integrations.hf import is_pretrained_folder, load_pretrained_weights
from .loggers import LogHub
from .loss import default_loss
from .microbatch import check_microbatch, initial_size, parse_bytes
from .runtime import Runtime, make_runtime
from .seeding import seed_everything


@dataclass(frozen=True)
class Durations:
    """How long to train and how often to evaluate and log, in typed time."""
    max_duration: "str | Time" = "1ep"
    eval_interval: "str | Time" = "1ep"
    log_interval: "str | Time" = "50ba"


@dataclass(frozen=True)
class StepOptions:
    """How one optimizer step is computed."""
    grad_accum: int = 1                        # micro-batches per step (the same step as one large batch)
    grad_clip_norm: float | None = None        # clip the global gradient norm (adds a GradientClipping)
    compile: "bool | dict" = False             # torch.compile the forward (a dict: its keyword arguments)
    batch_fn: Callable = inputs_targets        # batch -> (inputs, targets)
    count_tokens: Callable = token_count       # a step's targets -> its token count (the clock's tokens)
    microbatch: "int | str | None" = None      # samples per micro-batch, or 'auto' (hasten.microbatch)
    memory_limit: "int | str | None" = None    # activation bytes a micro-batch may save (CPU out of memory)
    activation_checkpointing: bool = False     # recompute each block's activations in the backward pass
    compile_optimizer: "bool | dict" = False   # torch.compile each optimizer's step (a dict: its keyword arguments)

    def __post_init__(self):
        if not isinstance(self.grad_accum, int) or self.grad_accum < 1:
            raise ValueError(f"grad_accum must be a whole number >= 1, got {self.grad_accum!r}")
        check_microbatch(self.microbatch)
        if self.microbatch is not None and self.grad_accum != 1:
            raise ValueError(f"give grad_accum ({self.grad_accum}) or microbatch ({self.microbatch!r}), not both: "
                             "microbatch sets the accumulation from the batch size")
        parse_bytes(self.memory_limit)
        if not isinstance(self.compile_optimizer, (bool, dict)):
            raise TypeError(f"compile_optimizer={self.compile_optimizer!r}: give True, False, or a dict of "
                            "torch.compile's arguments")
        if not isinstance(self.compile, (bool, dict)):
            raise TypeError(f"compile={self.compile!r}: give True, False, or a dict of torch.compile's arguments, "
                            "e.g. compile={'mode': 'max-autotune'}")
        if self.grad_clip_norm is not None and not (isinstance(self.grad_clip_norm, (int, float))
                                                    and self.grad_clip_norm > 0):
            raise ValueError(f"grad_clip_norm={self.grad_clip_norm!r}: give the largest gradient norm, a number > 0, "
                             "or None for no clipping")


@dataclass(frozen=True)
class CheckpointOptions:
    """Where and how often to save, and what to start from."""
    save_folder: str | None = None             # checkpoints go here (a Checkpoint callback is made)
    save_interval: "str | Time | None" = None  # default: every epoch
    load_path: str | None = None               # start from this checkpoint (weights, optimizer, clock)
    autoresume: bool = False                   # continue from the newest checkpoint in save_folder
    io: CheckpointIO | None = None             # default: one file per checkpoint (sharded under FSDP)
    hyperparameters: str = "checkpoint"        # on resume, the optimizers' settings: the checkpoint's, or
                                               # 'run': as built for this run (a forced change applied)
    load_mode: str = "full"                    # load_path: 'full' (weights, optimizer, clock) or 'weights'
                                               # (the model's tensors that fit by name and shape)

    def __post_init__(self):
        if self.load_mode not in ("full", "weights"):
            raise ValueError(f"load_mode={self.load_mode!r}: use 'full' or 'weights'")


@dataclass
class Parts:
    """What a Trainer trains with: the assembled state and its helpers."""
    state: State
    engine: Engine
    logger: LogHub
    runtime: Runtime
    eval_interval: Interval
    log_interval: Interval
    metrics: dict
    step: StepOptions
    checkpoint_io: CheckpointIO
    checkpointer: Checkpoint | None
    prepared: Prepared
    stop: StopCoordinator
    save_folder: str | None = None
    eval_dataloader: Any = None


def runtime_for(runtime: Runtime | None, **asked) -> Runtime:
    """`runtime`, or one made from the keywords given (device auto, precision fp32, seed 0 and
    the host allocator left as it is, unless given); giving both is an error."""
    asked = {k: v for k, v in asked.items() if v is not None}
    if runtime is None:
        return make_runtime(**{"device": "auto", "precision": "fp32", "seed": 0, "host_allocator": "default", **asked})
    if asked:
        raise ValueError(f"give runtime= or {', '.join(asked)}, not both: the runtime already "
                         "holds them (hasten.make_runtime(...))")
    return runtime


def assemble(model: "torch.nn.Module | Callable[[], torch.nn.Module]", runtime: Runtime, *,
             train_dataloader: Iterable | None = None, eval_dataloader: Iterable | None = None,
             optimizers: Any = None, schedulers: Any = None, loss_fn: Callable | None = None,
             metrics: dict | None = None, algorithms: Sequence = (), callbacks: Sequence = (), loggers: Sequence = (),
             durations: Durations = Durations(), step: StepOptions = StepOptions(),
             checkpoints: CheckpointOptions = CheckpointOptions(),
             parallel: ParallelOptions = ParallelOptions(), quality: "tuple[str, str] | None" = None) -> Parts:
    """Everything a Trainer needs, in the order of the module docstring."""
    seed_everything(runtime.seed)   # the training stream starts from the seed, whatever building the model drew
    model = _model(model)
    world = runtime.world
    check_arguments(train_dataloader, eval_dataloader, loss_fn, metrics)
    algorithms = listed("algorithms", algorithms)
    callbacks, loggers = listed("callbacks", callbacks), listed("loggers", loggers)
    if step.grad_clip_norm is not None:   # one owner of clipping: the algorithm, last at BEFORE_OPTIM_STEP
        if any(isinstance(a, GradientClipping) and a.mode == "norm" for a in algorithms):
            raise ValueError("give grad_clip_norm or a GradientClipping(mode='norm') algorithm, not both")
        algorithms.append(GradientClipping("norm", step.grad_clip_norm))
    io = checkpoints.io
    if io is None and world.sharded and FSDPOptions.of(parallel.fsdp).checkpoint == "sharded":
        io = ShardedCheckpointIO()   # each rank writes its shards
    io = io or CheckpointIO()
    callbacks, checkpointer, save_folder = _checkpoint_callback(list(callbacks), checkpoints, io)
    # under data parallelism rank 0 alone writes: the callbacks that write (progress,
    # checkpoints) and the loggers run there only; every rank reads checkpoints to resume
    if not world.is_main:
        callbacks, loggers = on_this_rank(callbacks, world, checkpointer), []
    state = State(model=model, max_duration=Time.parse(durations.max_duration), runtime=runtime,
                  loss_fn=loss_fn or default_loss, train_dataloader=train_dataloader,
                  eval_dataloader=eval_dataloader, algorithms=algorithms, callbacks=callbacks,
                  grad_accum=step.grad_accum, batch_fn=step.batch_fn, autocast=runtime.autocast,
                  quality=_quality(quality), microbatch=initial_size(step.microbatch),
                  microbatch_auto=step.microbatch == "auto")
    if state.microbatch_auto and world.sharded:
        raise ValueError("microbatch='auto' under parallelism 'fsdp' is not supported yet (a sharded step cannot "
                         "be redone on one rank); give a micro-batch size")
    if step.compile_optimizer and world.sharded:
        raise ValueError("compile_optimizer under parallelism 'fsdp' is not supported yet (sharded parameters): "
                         "drop one of the two")
    if step.compile_optimizer and runtime.precision == "fp16-mixed":
        raise ValueError("compile_optimizer with fp16-mixed is not supported (its loss scaler steps the optimizers "
                         "itself): use bf16-mixed, or drop compile_optimizer")
    if state.max_duration.unit == TimeUnit.DURATION:
        raise ValueError("max_duration cannot be a fraction ('dur'); use ep, ba, sp, tok or s/m/h")
    logger = LogHub(loggers)
    engine = Engine(state, logger)
    eval_interval, log_interval = Interval(durations.eval_interval), Interval(durations.log_interval)
    prepared = prepare(state, engine, parallel, optimizers, schedulers, step.compile, step.activation_checkpointing)
    parts = Parts(state=state, engine=engine, logger=logger, runtime=runtime, eval_interval=eval_interval,
                  log_interval=log_interval, metrics=dict(metrics or {}), step=step, checkpoint_io=io,
                  checkpointer=checkpointer, prepared=prepared, stop=StopCoordinator(world),
                  save_folder=save_folder, eval_dataloader=eval_dataloader)
    latest = load_latest(save_folder, io) if checkpoints.autoresume else None
    if latest is not None:
        resume_from(state, logger, *latest, hyperparameters=checkpoints.hyperparameters)
    else:
        if checkpoints.autoresume:
            logger.resume_at(0)   # nothing to resume: the run starts over, and so do its logs (each step once)
        if checkpoints.load_path:
            start_from(state, logger, checkpoints, io)
    return parts


def _quality(quality) -> tuple[str, str]:
    """(metric, 'max' or 'min'): what judges the run (a task's Quality, a pair, or None: val/loss, lower better)."""
    if quality is None:
        return ("val/loss", "min")
    metric, direction = (quality.metric, quality.direction) if hasattr(quality, "direction") else quality
    if direction not in ("max", "min") or not isinstance(metric, str):
        raise ValueError(f"quality={quality!r}: give (metric, 'max' or 'min'), e.g. ('val/acc', 'max')")
    return metric, direction


def _model(model) -> torch.nn.Module:
    if isinstance(model, torch.nn.Module):
        return model
    if not callable(model):
        raise TypeError(f"model must be a torch.nn.Module or a function returning one, got {type(model).__name__}")
    made = model()
    if not isinstance(made, torch.nn.Module):
        raise TypeError(f"the model factory returned a {type(made).__name__}, not a torch.nn.Module")
    return made


def _checkpoint_callback(callbacks: list, checkpoints: CheckpointOptions, io: CheckpointIO):
    """(callbacks, the Checkpoint callback or None, the save folder): save_folder makes one;
    a Checkpoint among the callbacks is used as it is; not both."""
    existing = [c for c in callbacks if isinstance(c, Checkpoint)]
    if checkpoints.save_folder is not None:
        if existing:
            raise ValueError("give either save_folder/save_interval or a Checkpoint callback, not both")
        existing = [Checkpoint(checkpoints.save_folder, interval=checkpoints.save_interval or "1ep", io=io)]
        callbacks.append(existing[0])
    checkpointer = existing[0] if existing else None   # writes the signal-time checkpoint too
    folder = checkpoints.save_folder if checkpoints.save_folder is not None else (
        str(checkpointer.folder) if checkpointer else None)
    if checkpoints.autoresume and not folder:
        raise ValueError("autoresume=True needs save_folder (or a Checkpoint callback): "
                         "that is where it looks for checkpoints")
    return callbacks, checkpointer, folder


def on_this_rank(callbacks, world, checkpointer=None) -> list:
    """The callbacks that run on this rank: all on rank 0, those that do not write elsewhere;
    with a sharded model also the checkpointer (gathering the model takes every rank)."""
    return [c for c in callbacks if world.is_main or not getattr(c, "main_rank_only", False)
            or (world.sharded and c is checkpointer)]


def start_from(state: State, logger: LogHub, checkpoints: CheckpointOptions, io: CheckpointIO) -> None:
    """`load_path`: a checkpoint, a run folder (its newest checkpoint) or a Hugging Face
    `save_pretrained` folder; all of it (`full`) or the model's weights that fit (`weights`)."""
    path = Path(checkpoints.load_path)
    if is_pretrained_folder(path):
        if not hasattr(state.model, "model"):
            raise CheckpointError(f"{path} is a Hugging Face save_pretrained folder: it loads into a Hugging Face model "
                                  "(model.name: hf/...), not this one")
        missing, unexpected = load_pretrained_weights(state.model, path)
        state.resumed_from = {"path": str(path), "weights_only": True, "fresh": missing, "unused": unexpected}
        return
    path = newest_in(path, io)
    payload = io.load(path)
    if checkpoints.load_mode == "weights":
        loaded, fresh, unused = load_weights(state.model, payload["model"])
        if not loaded:
            raise CheckpointError(f"no tensor of {path} fits this model by name and shape; is it a checkpoint of "
                                  "the model you mean to start from?")
        state.resumed_from = {"path": str(path), "weights_only": True, "loaded": len(loaded), "fresh": fresh,
                              "unused": unused}
        return
    resume_from(state, logger, path, payload, hyperparameters=checkpoints.hyperparameters)


def newest_in(path: Path, io: CheckpointIO) -> Path:
    """A run folder or a folder of checkpoints (save_folder, with hasten's index) stands for
    its newest checkpoint that loads; a checkpoint file or a sharded checkpoint for itself."""
    path = Path(path)
    if (path / "checkpoints").is_dir():
        folder, what = path / "checkpoints", "a run folder"
    elif (path / INDEX).is_file() and not (path / REST).exists():
        folder, what = path, "a checkpoint folder"
    else:
        return path
    latest = find_latest(folder, io)
    if latest is None:
        raise CheckpointError(f"{path} is {what} without a checkpoint to start from")
    return latest


def resume_from(state: State, logger: LogHub, path, payload: dict, hyperparameters: str = "checkpoint") -> dict:
    """Load a checkpoint's payload into the state, and tell the loggers where the run continues."""
    meta = restore(state, payload, hyperparameters=hyperparameters)
    state.last_checkpoint = str(path)
    state.resumed_from = {"path": str(path), "run_id": meta.get("run_id")}
    logger.resume_at(state.timestamp.batch)
    return meta
