"""The one assembler: from a model, its data and the grouped options to the parts a Trainer
trains with. `hasten train` (hasten.build), `hasten compress` and a Python user's
`Trainer(...)` all come through `assemble`; the Trainer itself only trains.

In order: the runtime's seed again (the training stream does not depend on how much
randomness building the model took), the model (a factory is called now), clipping as an
algorithm, the checkpoint writer and callback, which callbacks and loggers run on this rank,
the State, loggers and engine, then `prepare` (device, INIT, wrapping, optimizers, compile),
the stop coordinator, and last the checkpoint to resume from. Each of these rules is written
here once; the options themselves are declared in hasten.assembly.options.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from ..algorithms.gradient_clipping import GradientClipping
from ..arguments import check_arguments, listed
from ..callbacks.checkpoint import INDEX, Checkpoint
from ..checkpoint import CheckpointIO, ShardedCheckpointIO, find_latest, load_latest, restore
from ..checkpoint.format import REST, check_loaded_share, load_weights
from ..core import Engine, Interval, State, Time
from ..distributed.stop import StopCoordinator
from ..errors import CheckpointError
from ..integrations.hf import is_pretrained_folder, load_pretrained_weights
from ..loggers import LogHub
from ..loss import default_loss
from ..microbatch import initial_size
from ..runtime import Runtime, make_runtime
from ..seeding import seed_everything
from .options import CheckpointOptions, Durations, ParallelOptions, StepOptions
from .prepare import Prepared, prepare


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
    io = checkpoints.io or checkpoint_io_for(world, parallel)
    callbacks, checkpointer, save_folder = _checkpoint_callback(list(callbacks), checkpoints, io,
                                                                durations.eval_interval)
    # under data parallelism rank 0 alone writes: the callbacks that write (progress,
    # checkpoints) and the loggers run there only; every rank reads checkpoints to resume
    callbacks = on_this_rank(callbacks, world, checkpointer)
    loggers = loggers if world.is_main else []
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
    logger = LogHub(loggers, on_error=durations.on_logger_error)
    engine = Engine(state, logger)
    eval_interval, log_interval = Interval(durations.eval_interval), Interval(durations.log_interval)
    prepared = prepare(state, engine, parallel, optimizers, schedulers, step.compile, step.activation_checkpointing)
    parts = Parts(state=state, engine=engine, logger=logger, runtime=runtime, eval_interval=eval_interval,
                  log_interval=log_interval, metrics=dict(metrics or {}), step=step, checkpoint_io=io,
                  checkpointer=checkpointer, prepared=prepared, stop=StopCoordinator(world),
                  save_folder=save_folder, eval_dataloader=eval_dataloader)
    logger.on_stop = parts.stop.request   # on_logger_error=stop: a clean stop, as on SIGTERM
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


def checkpoint_io_for(world, parallel: ParallelOptions) -> CheckpointIO:
    """The checkpoint writer a run uses unless it gives its own: a folder of shards that every
    rank writes under sharded FSDP (trainer.fsdp.checkpoint=sharded), else one file."""
    return ShardedCheckpointIO() if world.sharded and parallel.fsdp.checkpoint == "sharded" else CheckpointIO()


def _checkpoint_callback(callbacks: list, checkpoints: CheckpointOptions, io: CheckpointIO, eval_interval):
    """(callbacks, the Checkpoint callback or None, the save folder): save_folder makes one
    (every save_interval, default the evaluation points, keeping keep_last); a Checkpoint among
    the callbacks is used as it is; not both."""
    existing = [c for c in callbacks if isinstance(c, Checkpoint)]
    if checkpoints.save_folder is not None:
        if existing:
            raise ValueError("give either save_folder/save_interval or a Checkpoint callback, not both")
        existing = [Checkpoint(checkpoints.save_folder, interval=checkpoints.save_interval or eval_interval,
                               keep_last=checkpoints.keep_last, io=io)]
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
        loaded, missing, unexpected = load_pretrained_weights(state.model, path,
                                                              check=lambda names: check_loaded_share(
                                                                  state.model.model, names, path,
                                                                  checkpoints.load_min_share))
        state.resumed_from = {"path": str(path), "weights_only": True, "loaded": len(loaded), "fresh": missing,
                              "unused": unexpected}
        return
    path = newest_in(path, io)
    payload = io.load(path)
    if checkpoints.load_mode == "weights":
        loaded, fresh, unused = load_weights(state.model, payload["model"],
                                             check=lambda names: check_loaded_share(state.model, names, path,
                                                                                    checkpoints.load_min_share))
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
    meta = restore(state, payload, hyperparameters=hyperparameters, path=path)
    state.last_checkpoint = str(path)
    state.resumed_from = {"path": str(path), "run_id": meta.get("run_id")}
    logger.resume_at(state.timestamp.batch)
    return meta
