"""From a validated recipe to a ready Trainer: model, data, optimizer, schedule,
algorithms, callbacks, loggers and a run folder. Nothing here is task-specific."""
from __future__ import annotations

import dataclasses
import datetime as _dt
from dataclasses import dataclass
from pathlib import Path

import torch

from .assemble import CheckpointOptions, Durations, StepOptions, assemble
from .callbacks import LRMonitor, ProgressBar, SpeedMonitor
from .callbacks.checkpoint import Checkpoint
from .checkpoint import ShardedCheckpointIO
from .distributed.prepare import ParallelOptions
from .config import OptimizerConfig, Recipe, make_algorithm
from .errors import ConfigError
from .files import LOCK_NAME, FolderLock, ensure_writable_dir
from .loggers import ConsoleLogger, JSONLLogger, TensorBoardLogger
from .optim import LRSchedule, apply_lr_multipliers, param_groups
from .optim.muon import muon_for, muon_optimizers, split_for_muon
from .optim.sgdw import SGDW, decoupled_hparams
from .runs import check_run_folder, write_run_folder
from .runtime import Runtime, make_runtime
from .tasks import TASKS
from .tasks.base import Built
from .trainer import Trainer


def build_optimizer(cfg: OptimizerConfig, model: torch.nn.Module, runtime: Runtime, batch_size: int | None = None):
    """The recipe's optimizer(s) for `model`; Muon's Newton-Schulz precision follows the runtime's."""
    sgd, adam, mu = cfg.sgd, cfg.adam, cfg.muon
    if sgd.per_example and cfg.name != "sgdw":
        raise ValueError(f"optimizer.sgd.per_example applies to sgdw only, not {cfg.name!r}")
    fused = cfg.fused if cfg.fused is not None else runtime.device.type in ("cpu", "cuda")
    if cfg.name == "muon" and mu.others == "adamw":
        return muon_optimizers(model, muon_lr=mu.lr, muon_momentum=mu.momentum,
                               muon_weight_decay=mu.weight_decay, adam_lr=cfg.lr, adam_betas=adam.betas,
                               adam_weight_decay=cfg.weight_decay, adjust_lr_fn=mu.adjust_lr, fused=cfg.fused,
                               ns_steps=mu.ns_steps, normalize_weights=mu.normalize,
                               ns_dtype=mu.ns_dtype, precision=runtime.precision)
    if cfg.name == "muon":   # Muon for the hidden matrices and kernels, SGD with the group rules for the rest
        hidden, other = split_for_muon(model)
        opts = [muon_for([p for _, p in hidden], mu.lr, mu.momentum, mu.weight_decay, mu.adjust_lr, mu.ns_steps,
                         mu.normalize, ns_dtype=mu.ns_dtype, precision=runtime.precision)] if hidden else []
        if other:
            groups = param_groups(other, cfg.weight_decay, cfg.decay_min_dim, tuple(cfg.no_decay), cfg.lr_multipliers,
                                  cfg.decay_ignores_lr_mult)
            opts.append(apply_lr_multipliers(torch.optim.SGD(groups, lr=cfg.lr, momentum=sgd.momentum,
                                                             nesterov=sgd.nesterov, fused=fused)))
        return opts
    groups = param_groups(model, cfg.weight_decay, cfg.decay_min_dim, tuple(cfg.no_decay), cfg.lr_multipliers,
                          cfg.decay_ignores_lr_mult)
    if cfg.name == "sgd":
        opt = torch.optim.SGD(groups, lr=cfg.lr, momentum=sgd.momentum, nesterov=sgd.nesterov, fused=fused)
    elif cfg.name == "sgdw":
        lr, wd = cfg.lr, cfg.weight_decay
        if sgd.per_example:
            if not batch_size:
                raise ValueError("optimizer.sgd.per_example needs the batch size (data.batch_size)")
            h = decoupled_hparams(cfg.lr, cfg.weight_decay, sgd.momentum, batch_size)
            lr, wd = h["lr"], h["weight_decay"]
            for g in groups:
                g["weight_decay"] = wd if g["weight_decay"] else 0.0
        opt = SGDW(groups, lr=lr, momentum=sgd.momentum, nesterov=sgd.nesterov)
    else:
        cls = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
        opt = cls(groups, lr=cfg.lr, betas=tuple(adam.betas), eps=adam.eps, fused=fused)
    return apply_lr_multipliers(opt)


def default_run_dir(recipe: Recipe) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{recipe.name}-{stamp}"


@dataclass
class Run:
    recipe: Recipe
    trainer: Trainer
    built: Built
    run_dir: Path
    lock: FolderLock | None = None   # held while this process writes the run folder

    def close(self) -> None:
        self.trainer.close()
        if self.lock is not None:
            self.lock.release()
        self.trainer.runtime.close()   # leaves the process group under torchrun


def build_algorithms(recipe: Recipe) -> list:
    """The recipe's algorithms; their arguments' values are checked here, before any data is loaded."""
    return [make_algorithm(name, params) for name, params in recipe.algorithms.items()]


def recipe_runtime(recipe: Recipe) -> Runtime:
    """The recipe's runtime, resolved and applied (threads, host allocator, seeds): the first
    thing a run does, before any data is loaded or model built."""
    t = recipe.trainer
    return make_runtime(device=t.device, precision=t.precision, seed=t.seed, threads=t.threads,
                        host_allocator=t.host_allocator, parallelism=t.parallelism, timeout_s=t.dist_timeout_s)


def build_run(recipe: Recipe, progress_bar: bool | None = None, console_logger: bool = True,
              force: bool = False) -> Run:
    """Everything for `recipe`, in this order: the runtime, the algorithms (their
    arguments checked), the run folder (writable, locked, new or this run resumed), then
    data and model, then the Trainer. `force`: resume even if the recipe changes the run."""
    t = recipe.trainer
    if t.autoresume and not t.run_dir:
        raise ConfigError("trainer.autoresume=true needs trainer.run_dir, the run folder to continue "
                          "(or use `hasten train --resume RUN_DIR`)")
    runtime = recipe_runtime(recipe)   # seeds too: the model below is initialised under the run's seed
    algorithms = build_algorithms(recipe)
    run_dir = Path(t.run_dir) if t.run_dir else default_run_dir(recipe)
    world = runtime.world
    if world.size > 1:   # data parallelism: rank 0 prepares and writes the folder, the others build the same run
        run_dir = _same_on_every_rank(run_dir)
    created, lock, changes, error = [], None, None, None

    def undo() -> None:
        """A run that never started leaves no folder behind: only its own lock file was in it."""
        if lock is not None:
            lock.release()
        if created:
            (run_dir / LOCK_NAME).unlink(missing_ok=True)
            for folder in created:
                try:
                    folder.rmdir()
                except OSError:
                    break   # something else is in it now: leave it

    if world.is_main:
        created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]   # the folders this run makes, deepest first
        try:
            lock = FolderLock(ensure_writable_dir(run_dir, "run folder"), "run folder").acquire()
            changes = check_run_folder(recipe, run_dir, force)
        except BaseException as e:
            error = e
    if world.size > 1:
        _stop_every_rank_if_main_failed(error)
    if error is not None:
        undo()
        raise error
    try:
        built = TASKS[recipe.task].build(recipe, runtime)
        trainer = _trainer(recipe, built, algorithms, run_dir, runtime, progress_bar, console_logger)
        if world.is_main:
            write_run_folder(recipe, run_dir, changes, force)
    except BaseException:
        undo()
        raise
    return Run(recipe=recipe, trainer=trainer, built=built, run_dir=run_dir, lock=lock)


def _same_on_every_rank(run_dir: Path) -> Path:
    """Rank 0's run folder, on every rank (a default name holds the time, which ranks may read
    a second apart)."""
    import torch.distributed as dist
    box = [str(run_dir)]
    dist.broadcast_object_list(box, src=0)
    return Path(box[0])


def _stop_every_rank_if_main_failed(error: BaseException | None) -> None:
    """Rank 0 tells the others whether it could prepare the run folder; if not, they stop too
    (rank 0 raises its own error)."""
    import torch.distributed as dist
    box = [None if error is None else f"{type(error).__name__}: {error}"]
    dist.broadcast_object_list(box, src=0)
    if error is None and box[0] is not None:
        raise ConfigError(f"rank 0 could not prepare the run folder: {box[0]}")


def _options(cls, section):
    """The grouped option `cls` from the recipe section that holds its fields under the same names."""
    return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(cls) if hasattr(section, f.name)})


def _trainer(recipe: Recipe, built: Built, algorithms: list, run_dir: Path, runtime: Runtime, progress_bar,
             console_logger: bool) -> Trainer:
    t = recipe.trainer
    main = runtime.world.is_main
    loggers = [JSONLLogger(run_dir / "metrics.jsonl")] if main else []
    if console_logger:
        loggers.append(ConsoleLogger())
    if t.tensorboard and main and TensorBoardLogger.available():
        loggers.append(TensorBoardLogger(run_dir / "tensorboard"))
    callbacks = [SpeedMonitor(flops_per_sample=built.flops_per_sample), LRMonitor()]
    if progress_bar if progress_bar is not None else t.progress_bar:
        callbacks.insert(0, ProgressBar())
    io = ShardedCheckpointIO() if runtime.world.sharded and t.fsdp.checkpoint == "sharded" else None
    if t.checkpoints:
        callbacks.append(Checkpoint(str(run_dir / "checkpoints"), interval=t.save_interval or t.eval_interval,
                                    keep_last=t.keep_last, io=io))
    s = recipe.schedule
    schedule = LRSchedule(s.name, warmup=s.warmup, warmdown=s.warmdown, min_factor=s.min_factor,
                          start_factor=s.start_factor)
    try:
        return Trainer.from_parts(assemble(
            built.model, runtime, train_dataloader=built.train_dataloader, eval_dataloader=built.eval_dataloader,
            optimizers=lambda model: build_optimizer(recipe.optimizer, model, runtime, recipe.data.batch_size),
            schedulers=[schedule], loss_fn=built.loss_fn, metrics=built.metrics, algorithms=algorithms,
            callbacks=callbacks, loggers=loggers, durations=_options(Durations, t), step=_options(StepOptions, t),
            checkpoints=CheckpointOptions(load_path=t.load_path, autoresume=t.autoresume, io=io),
            parallel=ParallelOptions(sync_batchnorm=t.sync_batchnorm, fsdp=t.fsdp if runtime.world.sharded else None)))
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from e
