"""From a validated recipe to a ready Trainer: model, data, optimizer, schedule,
algorithms, callbacks, loggers and a run folder. Nothing here is task-specific."""
from __future__ import annotations

import datetime as _dt
import inspect
import json
import threading
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from .assembly import CheckpointOptions, Durations, ParallelOptions, StepOptions, assemble
from .callbacks import LRMonitor, Profile, ProgressBar, SpeedMonitor
from .callbacks.checkpoint import INDEX as CHECKPOINT_INDEX
from .callbacks.checkpoint import TEMPORARY, remove_owned
from .config import Recipe, make_algorithm, to_dict
from .distributed.fsdp import FSDPOptions
from .errors import ConfigError
from .files import LOCK_NAME, FolderLock, atomic_write, ensure_writable_dir
from .loggers import ConsoleLogger, JSONLLogger, MLflowLogger, TensorBoardLogger, WandbLogger
from .optim import LRSchedule
from .optim.factory import build_optimizer
from .runs import RECIPE_FILE, RUN_OUTPUTS, TRACKERS_FILE, check_run_folder, check_tokenizer_of_source, write_run_folder
from .runtime import Runtime, make_runtime, resolve_device
from .schema import group_from
from .tasks import TASKS
from .tasks.base import Built
from .trainer import Trainer


def default_run_dir(recipe: Recipe) -> Path:
    """runs/RECIPE-DATE-TIME, with -2, -3, ... when a run started in the same second."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{recipe.name}-{stamp}"
    return next(p for p in (base, *(Path(f"{base}-{i}") for i in range(2, 10_000))) if not p.exists())


@dataclass
class Run:
    recipe: Recipe
    trainer: Trainer
    built: Built
    run_dir: Path
    lock: FolderLock | None = None   # held while this process writes the run folder
    new: bool = True                 # a new run (not a resumed one)
    created: list = field(default_factory=list)   # the folders this run made, deepest first

    @property
    def trained(self) -> bool:
        """Whether this process trained at least one step (a resumed run counts as trained)."""
        return not self.new or self.trainer.state.timestamp.batch > 0

    def close(self, discard: bool = False) -> None:
        """Close the loggers, the lock and the process group; with `discard`, a new run that
        never trained first removes what it made (hasten.build.remove_made)."""
        self.trainer.close()
        if discard and self.new and self.trainer.world.is_main:
            remove_made(self.run_dir, self.created, self.trainer.checkpointer)
        if self.lock is not None:
            self.lock.release()
        self.trainer.runtime.close()   # leaves the process group under torchrun


def remove_made(run_dir: Path, created: list, checkpointer=None) -> None:
    """Remove what a new run made in its folder, and nothing else: recipe.yaml, its logs (a new
    run folder held none: hasten.runs.check_run_folder), the checkpoints this run wrote and
    their folder's index and lock when nothing else is in it, its lock file, and then the
    folders it created, if empty."""
    for name in (RECIPE_FILE, *RUN_OUTPUTS):
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_file() or path.is_symlink():
            path.unlink()
    if checkpointer is not None:
        folder = checkpointer.folder
        for entry in checkpointer.saved:
            remove_owned(folder, entry["name"])
        if folder.is_dir():
            leftovers = {p.name for p in folder.iterdir()} - {CHECKPOINT_INDEX, LOCK_NAME}
            if not leftovers or all(TEMPORARY.match(n) for n in leftovers):
                shutil.rmtree(folder)
    (run_dir / LOCK_NAME).unlink(missing_ok=True)
    for folder in created:
        try:
            folder.rmdir()
        except OSError:
            break   # something else is in it now: leave it


def build_algorithms(recipe: Recipe) -> list:
    """The recipe's algorithms; their arguments' values are checked here, before any data is loaded."""
    return [make_algorithm(name, params) for name, params in recipe.algorithms.items()]


def recipe_runtime(recipe: Recipe) -> Runtime:
    """The recipe's runtime, resolved and applied (threads, host allocator, seeds): the first
    thing a run does, before any data is loaded or model built."""
    t = recipe.trainer
    try:
        resolve_device(t.device)   # a device this machine lacks: refused before anything is set up
    except ValueError as e:
        raise ConfigError(f"trainer.device: {e}") from None
    try:
        return make_runtime(device=t.device, precision=t.precision, seed=t.seed, threads=t.threads,
                            host_allocator=t.host_allocator, parallelism=t.parallelism, timeout_s=t.dist_timeout_s)
    except ValueError as e:   # e.g. launched with several processes but parallelism=none
        raise ConfigError(str(e)) from None


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

    def undo(trainer=None) -> None:
        """A run that never started leaves nothing behind: a new run removes what it made (a
        folder refused before that keeps everything but the lock file of a folder it created)."""
        if trainer is not None:
            trainer.close()
        if world.is_main and error is None and changes is None:
            remove_made(run_dir, created, trainer.checkpointer if trainer is not None else None)
        elif world.is_main and not had_lock_file:
            (run_dir / LOCK_NAME).unlink(missing_ok=True)
            for folder in created:
                try:
                    folder.rmdir()
                except OSError:
                    break   # something else is in it now: leave it
        if lock is not None:
            lock.release()

    had_lock_file = (run_dir / LOCK_NAME).exists()
    if world.is_main:
        created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]   # the folders this run makes, deepest first
        try:
            lock = FolderLock(ensure_writable_dir(run_dir, "run folder"), "run folder").acquire()
            changes = check_run_folder(recipe, run_dir, force)
        except BaseException as e:
            error = e
    if world.size > 1:
        changes = _share_main_result(error, changes)
    if error is not None:
        undo()
        raise error
    trainer = None
    try:
        built = TASKS[recipe.task].make(recipe, runtime)
        if t.load_path and not changes:   # fine-tuning from another run: the same tokenizer
            check_tokenizer_of_source(t.load_path, getattr(recipe.data, "tokenizer_sha256", None))
        # a resume that changes the optimizer's settings (allowed with --force) applies them
        hyperparameters = "run" if any(k.startswith("optimizer.") for k in changes or {}) else "checkpoint"
        trainer = _trainer(recipe, built, algorithms, run_dir, runtime, progress_bar, console_logger, hyperparameters)
        if world.is_main:
            write_run_folder(recipe, run_dir, changes, force)
            trainer.logger.log_hparams(to_dict(recipe))   # trackers show the recipe beside the metrics
    except BaseException:
        undo(trainer)
        raise
    return Run(recipe=recipe, trainer=trainer, built=built, run_dir=run_dir, lock=lock, new=changes is None,
               created=created)


def _same_on_every_rank(run_dir: Path) -> Path:
    """Rank 0's run folder, on every rank (a default name holds the time, which ranks may read
    a second apart)."""
    box = [str(run_dir)]
    dist.broadcast_object_list(box, src=0)
    return Path(box[0])


def _share_main_result(error: BaseException | None, changes):
    """Rank 0 tells the others whether it could prepare the run folder (if not, they stop too;
    rank 0 raises its own error) and what the resume changes; returns those changes on every rank."""
    box = [None if error is None else f"{type(error).__name__}: {error}", changes]
    dist.broadcast_object_list(box, src=0)
    if error is None and box[0] is not None:
        raise ConfigError(f"rank 0 could not prepare the run folder: {box[0]}")
    return box[1]


TRACKER_SETUP_S = 30.0   # a tracker that cannot be reached fails the run's set-up within this


def _set_up_tracker(key: str, make):
    """`make()` within TRACKER_SETUP_S seconds, in a thread (a tracker's client may retry for
    minutes); any failure is one line naming the setting."""
    box: dict = {}

    def run():
        try:
            box["logger"] = make()
        except BaseException as e:   # handed to the caller's thread
            box["error"] = e
    worker = threading.Thread(target=run, name=f"hasten-{key}-setup", daemon=True)
    worker.start()
    worker.join(TRACKER_SETUP_S)
    if worker.is_alive():
        raise ConfigError(f"trainer.{key}: the tracker did not answer within {TRACKER_SETUP_S:.0f} s; check that its "
                          f"server is up and its address right, or remove trainer.{key}")
    e = box.get("error")
    if e is not None:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise ConfigError(f"trainer.{key}: could not start the tracker ({type(e).__name__}: {first}); check its "
                          f"settings, or remove trainer.{key}") from e
    return box["logger"]


def tracker_loggers(t, run_dir: Path, name: str) -> list:
    """The MLflow and W&B loggers the recipe asks for (trainer.mlflow, trainer.wandb); their run
    ids are kept in the run folder, so a resumed run continues the same tracker run."""
    ids_file = run_dir / TRACKERS_FILE
    try:
        ids = json.loads(ids_file.read_text()) if ids_file.exists() else {}
    except (OSError, ValueError):
        ids = {}
    made = []
    for key, cls, id_arg, extra in (("mlflow", MLflowLogger, "run_id", "mlflow"), ("wandb", WandbLogger, "id", "wandb")):
        options = getattr(t, key)
        if options is None:
            continue
        if not cls.available():
            raise ConfigError(f"trainer.{key} needs its package: pip install 'hasten[{extra}]'")
        args = {("run_name" if key == "mlflow" else "name"): name, **options}
        if ids.get(key):
            args[id_arg] = ids[key]
        try:
            inspect.signature(cls).bind(**args)
        except TypeError as e:
            raise ConfigError(f"trainer.{key}: {e} (it takes {sorted(inspect.signature(cls).parameters)})") from None
        logger = _set_up_tracker(key, lambda: cls(**args))
        ids[key] = getattr(logger, id_arg)
        made.append(logger)
    if made:
        atomic_write(ids_file, lambda f: json.dump(ids, f), binary=False)
    return made


def step_options(t) -> StepOptions:
    """The recipe's step options: its StepOptions fields, with `compile_mode` made torch.compile's mode."""
    if t.compile_mode is not None and not t.compile:
        raise ConfigError(f"trainer.compile_mode={t.compile_mode} is torch.compile's mode: add trainer.compile=true "
                          "(or drop compile_mode)")
    compile_ = {"mode": t.compile_mode} if t.compile_mode is not None else t.compile
    return group_from(StepOptions, t, compile=compile_)


def _trainer(recipe: Recipe, built: Built, algorithms: list, run_dir: Path, runtime: Runtime, progress_bar,
             console_logger: bool, hyperparameters: str = "checkpoint") -> Trainer:
    t = recipe.trainer
    loggers = [JSONLLogger(run_dir / "metrics.jsonl")] if runtime.world.is_main else []   # (files: rank 0's)
    if console_logger:
        loggers.append(ConsoleLogger())
    if t.tensorboard and runtime.world.is_main and TensorBoardLogger.available():
        loggers.append(TensorBoardLogger(run_dir / "tensorboard"))
    if runtime.world.is_main:
        loggers += tracker_loggers(t, run_dir, recipe.name)
    callbacks = [SpeedMonitor(flops_per_sample=built.flops_per_sample), LRMonitor()]
    if t.profile:
        callbacks.append(Profile(steps=t.profile, folder=run_dir / "profile"))
    if progress_bar if progress_bar is not None else t.progress_bar:
        callbacks.insert(0, ProgressBar())
    s = recipe.schedule
    schedule = LRSchedule(s.name, warmup=s.warmup, warmdown=s.warmdown, min_factor=s.min_factor,
                          start_factor=s.start_factor)
    try:
        return Trainer.from_parts(assemble(
            built.model, runtime, train_dataloader=built.train_dataloader, eval_dataloader=built.eval_dataloader,
            optimizers=lambda model: build_optimizer(recipe.optimizer, model, runtime, recipe.data.batch_size,
                                                     compiled=bool(t.compile_optimizer)),
            schedulers=[schedule], loss_fn=built.loss_fn, metrics=built.metrics, algorithms=algorithms,
            callbacks=callbacks, loggers=loggers, durations=group_from(Durations, t), step=step_options(t),
            checkpoints=group_from(CheckpointOptions, t, hyperparameters=hyperparameters,
                                   save_folder=str(run_dir / "checkpoints") if t.checkpoints else None),
            # trainer.fsdp is read under parallelism=fsdp only (docs/distributed.md)
            parallel=group_from(ParallelOptions, t, fsdp=t.fsdp if runtime.world.sharded else FSDPOptions()),
            quality=TASKS[recipe.task].quality))
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from e
