"""The Trainer: the textbook training loop, with named events between its lines.

Read `fit`, `_run_epoch` (one batch: fetch, schedules, step, optimizer, advance, batch end)
and `_forward_backward` (the micro-steps: forward, loss, reduce, backward) top to bottom:
everything a method changes happens in an Algorithm at one of the events (or through the
step and loss seams), and everything that watches happens in a Callback.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
import warnings
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.nn.functional as F

from .checkpoint import CheckpointIO, load_latest, restore, save
from .core import Algorithm, Engine, Event, Interval, State, Time, TimeUnit
from .core.algorithm import parallel_refusal_message
from .data import sharding
from .data.resumable import epoch_iterator
from .errors import TrainingError
from .loggers import LogHub
from .runtime import PRECISIONS, Runtime, make_runtime  # noqa: F401  (PRECISIONS: re-exported)
from .utils import batch_size, forward, inputs_targets, seed_everything, shard_batch, split_batch, to_device

# Events as module constants: looking members up on an Enum class is slow in Python 3.11.
(AFTER_BACKWARD, AFTER_DATALOADER, AFTER_FORWARD, AFTER_LOSS, AFTER_OPTIM_STEP, BATCH_END, BATCH_START, BEFORE_BACKWARD, BEFORE_DATALOADER, BEFORE_FORWARD, BEFORE_LOSS, BEFORE_OPTIM_STEP, CHECKPOINT, EPOCH_END, EPOCH_START, EVAL_BATCH_END, EVAL_BATCH_START, EVAL_END, EVAL_START, FIT_END, FIT_START, INIT, PREDICT_BATCH_END, PREDICT_END, PREDICT_START) = (
    Event.AFTER_BACKWARD, Event.AFTER_DATALOADER, Event.AFTER_FORWARD, Event.AFTER_LOSS, Event.AFTER_OPTIM_STEP, Event.BATCH_END, Event.BATCH_START, Event.BEFORE_BACKWARD, Event.BEFORE_DATALOADER, Event.BEFORE_FORWARD, Event.BEFORE_LOSS, Event.BEFORE_OPTIM_STEP, Event.CHECKPOINT, Event.EPOCH_END, Event.EPOCH_START, Event.EVAL_BATCH_END, Event.EVAL_BATCH_START, Event.EVAL_END, Event.EVAL_START, Event.FIT_END, Event.FIT_START, Event.INIT, Event.PREDICT_BATCH_END, Event.PREDICT_END, Event.PREDICT_START)



def default_loss(outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    """Per-sample (or per-token) cross-entropy: the Trainer does the reduction.

    When nothing listens to AFTER_LOSS and there is one micro-batch, the Trainer asks for
    reduction="mean" instead: the same number, computed inside the loss kernel.
    """
    if outputs.dim() > 2:  # (B, T, V) language-model logits
        return F.cross_entropy(outputs.flatten(0, -2).float(), targets.flatten(), reduction=reduction)
    return F.cross_entropy(outputs, targets, reduction=reduction)


# errors a loss raises when the model's outputs do not fit it (out-of-memory is not one)
_LOSS_FAULTS = (ValueError, IndexError, TypeError, RuntimeError)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} ({str(x.dtype).replace('torch.', '')})"
    if isinstance(x, dict):
        return f"a dict with keys {sorted(map(str, x))[:6]}"
    return f"a {type(x).__name__}"


def loss_fault(error: Exception | None, outputs, targets, returned: Any = None) -> Exception:
    """hasten's error for a loss that cannot be computed or returns no tensor; an
    out-of-memory error passes through as it is."""
    if isinstance(error, torch.OutOfMemoryError):
        return error
    if error is None:
        return TrainingError(f"the loss function returned {_describe(returned)}; it must return a tensor of "
                             "per-sample (or per-token) losses, or a scalar")
    return TrainingError(f"the loss function failed on the model's outputs ({_describe(outputs)}) and the "
                         f"targets ({_describe(targets)}): {type(error).__name__}: {str(error).rstrip('.')}. Check that the "
                         "model's outputs fit the loss (e.g. logits (batch, classes) with class-index targets)")


def _process_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _default_token_count(targets) -> int:
    if isinstance(targets, torch.Tensor) and targets.dim() >= 2 and not targets.is_floating_point():
        return targets.numel()
    return 0


class Trainer:
    """Trains a model. See the README for a tour and docs/trainer.md for every argument.

    model: a module, or a factory `f() -> module` called once the runtime is resolved (so the
        model is initialised under the run's seed).
    runtime: a `hasten.Runtime` from `hasten.make_runtime` (device, precision, seed, threads,
        host allocator, resolved once); or give device / precision / seed / host_allocator
        here and the Trainer makes one (defaults: device auto, precision fp32, seed 0,
        host allocator left as it is). Not both.
    optimizers: an optimizer, a list of them, or a factory `f(model) -> optimizer(s)` that is
        called after the INIT event, so algorithms that replace modules need no remapping.
        Default: AdamW(lr=1e-3).
    schedulers: hasten schedules (functions of training progress, see hasten.optim), torch
        LR schedulers (stepped once per batch), or factories `f(optimizer) -> scheduler`.
    loss_fn: `loss_fn(outputs, targets)` returning per-sample (or per-token) losses, or a
        scalar. The Trainer reduces: the mean over all samples of the step, across
        micro-batches, so grad_accum=k equals one batch k times larger.
    sync_batchnorm: under data parallelism, normalise batch-norm layers over the whole global
        batch (torch.nn.SyncBatchNorm, CUDA only in torch 2.13) instead of each rank's share.
    fsdp: under parallelism 'fsdp', hasten.fsdp.FSDPOptions or a dict of them
        (reshard_after_forward, activation_checkpointing, blocks); see docs/distributed.md.
    host_allocator: 'default' (the default) leaves glibc malloc as it is; 'auto' tunes its
        thresholds when training on the CPU (what `hasten train` does), 'tuned' whatever the
        device (see hasten.allocator).
    """

    def __init__(
        self,
        model: "torch.nn.Module | Callable[[], torch.nn.Module]",
        train_dataloader: Iterable | None = None,
        optimizers: Any = None,
        schedulers: Any = None,
        loss_fn: Callable | None = None,
        max_duration: "str | Time" = "1ep",
        eval_dataloader: Iterable | None = None,
        eval_interval: "str | Time" = "1ep",
        metrics: dict | None = None,
        algorithms: Sequence = (),
        callbacks: Sequence = (),
        loggers: Sequence = (),
        precision: str | None = None,
        device: "str | torch.device | None" = None,
        compile: "bool | dict" = False,
        grad_accum: int = 1,
        grad_clip_norm: float | None = None,
        seed: int | None = None,
        save_folder: str | None = None,
        save_interval: "str | Time | None" = None,
        load_path: str | None = None,
        autoresume: bool = False,
        log_interval: "str | Time" = "50ba",
        batch_fn: Callable = inputs_targets,
        count_tokens: Callable = _default_token_count,
        checkpoint_io: CheckpointIO | None = None,
        host_allocator: str | None = None,
        runtime: Runtime | None = None,
        sync_batchnorm: bool = False,
        fsdp: "dict | None" = None,
    ):
        if not isinstance(grad_accum, int) or grad_accum < 1:
            raise ValueError(f"grad_accum must be a whole number >= 1, got {grad_accum!r}")
        asked = {k: v for k, v in (("device", device), ("precision", precision), ("seed", seed),
                                   ("host_allocator", host_allocator)) if v is not None}
        if runtime is None:
            runtime = make_runtime(**{"device": "auto", "precision": "fp32", "seed": 0,
                                      "host_allocator": "default", **asked})
        elif asked:
            raise ValueError(f"give runtime= or {', '.join(asked)}, not both: the runtime already "
                             "holds them (hasten.make_runtime(...))")
        seed_everything(runtime.seed)   # the training stream starts from the seed, whatever building the model drew
        if not isinstance(model, torch.nn.Module):
            if not callable(model):
                raise TypeError(f"model must be a torch.nn.Module or a function returning one, got {type(model).__name__}")
            model = model()
            if not isinstance(model, torch.nn.Module):
                raise TypeError(f"the model factory returned a {type(model).__name__}, not a torch.nn.Module")
        self.runtime, self.world = runtime, runtime.world
        self.device, precision, seed = runtime.device, runtime.precision, runtime.seed
        self.host_allocator = runtime.allocator_report
        self._on_cpu = self.device.type == "cpu"   # CPU batches need no move
        self._fused_mean = False
        model = model.to(self.device)
        self.batch_fn, self.count_tokens, self.grad_clip_norm = batch_fn, count_tokens, grad_clip_norm
        algorithms = list(algorithms)
        if grad_clip_norm is not None:   # one owner of clipping: the algorithm, last at BEFORE_OPTIM_STEP
            from .algorithms.grad_clipping import GradientClipping
            if any(isinstance(a, GradientClipping) and a.mode == "norm" for a in algorithms):
                raise ValueError("give grad_clip_norm or a GradientClipping(mode='norm') algorithm, not both")
            algorithms.append(GradientClipping("norm", grad_clip_norm))
        fsdp_options = None
        if self.world.sharded:
            from .fsdp import FSDPOptions
            fsdp_options = fsdp if isinstance(fsdp, FSDPOptions) else FSDPOptions(**(fsdp or {}))
        elif fsdp:
            raise ValueError("fsdp options were given but the run is not sharded: set parallelism=fsdp "
                             "(trainer.parallelism=fsdp) or leave the fsdp options out")
        if checkpoint_io is None and fsdp_options is not None and fsdp_options.checkpoint == "sharded":
            from .checkpoint_sharded import ShardedCheckpointIO
            checkpoint_io = ShardedCheckpointIO()   # each rank writes its shards
        self.checkpoint_io = checkpoint_io or CheckpointIO()
        self.metrics = dict(metrics or {})
        self.eval_dataloader = eval_dataloader
        callbacks = list(callbacks)
        from .callbacks.checkpoint import Checkpoint
        existing = [c for c in callbacks if isinstance(c, Checkpoint)]
        if save_folder is not None:
            if existing:
                raise ValueError("give either save_folder/save_interval or a Checkpoint callback, not both")
            existing = [Checkpoint(save_folder, interval=save_interval or "1ep", io=self.checkpoint_io)]
            callbacks.append(existing[0])
        self.checkpointer = existing[0] if existing else None   # writes the signal-time checkpoint too
        # under data parallelism rank 0 alone writes: the callbacks that write (progress,
        # checkpoints) and the loggers run there only; every rank reads checkpoints to resume
        if not self.world.is_main:
            callbacks, loggers = self._on_this_rank(callbacks), []
        self.save_folder = save_folder if save_folder is not None else (
            str(self.checkpointer.folder) if self.checkpointer else None)
        if autoresume and not self.save_folder:
            raise ValueError("autoresume=True needs save_folder (or a Checkpoint callback): "
                             "that is where it looks for checkpoints")

        self.state = State(
            model=model, max_duration=Time.parse(max_duration), device=self.device, precision=precision,
            loss_fn=loss_fn or default_loss, train_dataloader=train_dataloader,
            eval_dataloader=eval_dataloader, algorithms=algorithms, callbacks=callbacks,
            seed=seed, grad_accum=grad_accum, runtime=runtime)
        if self.state.max_duration.unit == TimeUnit.DURATION:
            raise ValueError("max_duration cannot be a fraction ('dur'); use ep, ba, sp, tok or s/m/h")
        self.logger = LogHub(loggers)
        self.engine = Engine(self.state, self.logger)
        self.eval_interval = Interval(eval_interval)
        self.log_interval = Interval(log_interval)

        # INIT: model surgery happens here; then (FSDP: the model is sharded) optimizers and
        # schedulers are built, so they hold the parameters as they will train.
        self.engine.run(INIT)
        if self.world.data_parallel:
            refused = parallel_refusal_message(self.state.algorithms, self.world.parallelism)
            if refused:
                raise ValueError(refused)
        if self.world.sharded:
            if sync_batchnorm:
                raise ValueError("sync_batchnorm is for parallelism=ddp; under fsdp each rank normalises its own "
                                 "share (ghost batch norm of the per-rank batch)")
            from .fsdp import shard_model
            shard_model(self.state.model, self.device, self.world.size, precision, fsdp_options)
        self.state.optimizers = self._build_optimizers(optimizers)
        self.state.schedulers = self._build_schedulers(schedulers)
        if precision == "fp16-mixed":
            self.state.scaler = torch.amp.GradScaler(self.device.type)
        self._ddp, model = None, self.state.model
        # gradient accumulation: reduce gradients across ranks on the last micro-batch only
        self._grad_sync = model.set_requires_gradient_sync if self.world.sharded else None
        if self.world.parallelism == "ddp":   # after INIT: model surgery is done; DDP broadcasts rank 0's weights
            if sync_batchnorm:
                if self.device.type != "cuda":
                    raise ValueError("sync_batchnorm needs CUDA (torch's SyncBatchNorm refuses CPU tensors); on the "
                                     "CPU each rank normalises its own share, which is ghost batch norm of the "
                                     "per-rank batch: leave sync_batchnorm off")
                model = self.state.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)   # same parameters
            from torch.nn.parallel import DistributedDataParallel
            options = {k: v for a in self.state.algorithms for k, v in a.ddp_options().items()}
            self._ddp = DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                                                **options)
            self._grad_sync = lambda sync: setattr(self._ddp, "require_backward_grad_sync", sync)   # what no_sync() sets
        self.state.forward_model = self._compile(self._ddp or model, compile)
        # DDP: evaluate the module inside (no collectives in evaluation); FSDP: the sharded model
        # itself (its forward gathers parameters: every rank runs every evaluation batch)
        self._eval_model = model if self._ddp is not None else self.state.forward_model
        self.state.batch_fn, self.state.autocast = batch_fn, runtime.autocast

        self._sharding, self._rank_scale = None, 1.0   # data parallel: who shares the batch; this rank's weight
        self._signal = threading.Event()   # SIGTERM or a first Ctrl-C: save at the end of this step, stop
        self._votes = self._vote_work = None
        self._vote_box = torch.zeros(1, dtype=torch.int32)   # reused every step: filled only after the last vote is read
        if self.world.size > 1:   # a CPU (gloo) group for the ranks' stop votes, whatever the device
            import socket

            import torch.distributed as dist
            self._votes = dist.new_group(backend="gloo")
            # where each rank runs, so that a rank that dies can be named by the others (same machine)
            dist.distributed_c10d._get_default_store().set(f"hasten/rank{self.world.rank}",
                                                           f"{socket.gethostname()} {os.getpid()}")
        self._signal_name = None
        self._evaluated_at: int | None = None   # batch of the last evaluation during fit
        latest = load_latest(self.save_folder, self.checkpointer.io) if autoresume else None
        if latest is not None:
            self._restore(*latest)
        elif load_path:
            self.load_checkpoint(load_path)

    # ------------------------------------------------------------------ set-up helpers
    def _build_optimizers(self, optimizers) -> list:
        model = self.state.model
        if optimizers is None:
            optimizers = torch.optim.AdamW(model.parameters(), lr=1e-3)
        elif callable(optimizers) and not isinstance(optimizers, torch.optim.Optimizer):
            optimizers = optimizers(model)
        opts = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
        owned = {id(p) for p in model.parameters()}
        for opt in opts:
            for g in opt.param_groups:
                for p in g["params"]:
                    if id(p) not in owned:
                        raise ValueError(
                            "an optimizer holds a parameter that is not in the model (was the model "
                            "changed after the optimizer was built?). Pass a factory, "
                            "optimizers=lambda model: torch.optim.SGD(model.parameters(), ...), "
                            "so it is built after model surgery.")
        return opts

    def _build_schedulers(self, schedulers) -> list:
        if schedulers is None:
            return []
        items = list(schedulers) if isinstance(schedulers, (list, tuple)) else [schedulers]
        out = []
        for s in items:
            if callable(s) and not hasattr(s, "step") and not hasattr(s, "apply"):
                s = s(self.state.optimizers[0])
            out.append(s)
        return out

    def _compile(self, model, compile):
        if not compile:
            return model
        kwargs = compile if isinstance(compile, dict) else {}
        return torch.compile(model, **kwargs)

    # ------------------------------------------------------------------ adding and describing
    def add_callbacks(self, *callbacks) -> None:
        """Add callbacks after the Trainer is built (they observe from the next event on); under
        data parallelism those that write (`main_rank_only`) run on rank 0 only."""
        self.state.callbacks.extend(self._on_this_rank(callbacks))
        self.engine.rebuild()

    def _on_this_rank(self, callbacks) -> list:
        """The callbacks that run on this rank: all on rank 0, those that do not write elsewhere;
        with a sharded model also the checkpointer (gathering the model takes every rank)."""
        return [c for c in callbacks if self.world.is_main or not getattr(c, "main_rank_only", False)
                or (self.world.sharded and c is self.checkpointer)]

    def add_algorithms(self, *algorithms) -> None:
        """Add algorithms after the Trainer is built, before fit. One that listens to INIT
        (model surgery) must be given to the constructor: INIT has already run."""
        for a in algorithms:
            if INIT in a.listens_to():
                raise ValueError(f"{a.name} changes the model at INIT, which has already run: "
                                 "pass it to Trainer(algorithms=...)")
        self.state.algorithms.extend(algorithms)
        self.engine.rebuild()

    def describe(self) -> str:
        """The event plan (who runs at each event, in order) and the two seams."""
        state = self.state
        step = [a.name for a in state.algorithms if type(a).wrap_step is not Algorithm.wrap_step]
        loss = "task loss"
        for a in state.algorithms:
            if type(a).wrap_loss is not Algorithm.wrap_loss:
                loss = f"{a.name}({loss})"
        return (self.engine.describe() + f"\n{'step seam':<18} " + (" wraps ".join(reversed(step)) + " wraps "
                if step else "") + "forward/backward" + f"\n{'loss seam':<18} training loss = {loss}; "
                "evaluation uses the task loss")

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path) -> str:
        """Write a checkpoint of the current state (atomically). With a sharded model every rank
        calls it (the model is gathered) and rank 0 writes."""
        return save(self.state, path, self.checkpoint_io, write=self.world.is_main)

    def load_checkpoint(self, path) -> dict:
        return self._restore(path, self.checkpoint_io.load(path))

    def _restore(self, path, payload: dict) -> dict:
        meta = restore(self.state, payload)
        self.state.last_checkpoint = str(path)
        self.state.resumed_from = {"path": str(path), "run_id": meta.get("run_id")}
        self.logger.resume_at(self.state.timestamp.batch)
        return meta

    # ------------------------------------------------------------------ fit
    def fit(self) -> State:
        state, run = self.state, self.engine.run
        if state.train_dataloader is None:
            raise ValueError("fit() needs a train_dataloader")
        loader = state.train_dataloader
        step = self._forward_backward
        for algo in state.algorithms:
            step = algo.wrap_step(step)
        self._step = step
        # the training loss: the task's loss wrapped by every algorithm, built once (the loss seam)
        train_loss = state.loss_fn
        for algo in state.algorithms:
            train_loss = algo.wrap_loss(train_loss)
        state.train_loss_fn = train_loss
        # the default loss with nobody reading per-sample losses: the mean inside the loss kernel
        self._fused_mean = (state.grad_accum == 1 and Event.AFTER_LOSS not in self.engine.active
                            and train_loss is default_loss)
        self._autocast_ctx = self.runtime.autocast()   # one context for every step (fp32: a shared no-op)
        self._sharding = self._share_loader(loader) if self.world.size > 1 else None
        self._progress_schedules = [s for s in state.schedulers if hasattr(s, "apply")]
        self._batch_schedulers = [s for s in state.schedulers if not hasattr(s, "apply")]
        state.steps_per_epoch = len(loader) if hasattr(loader, "__len__") else None
        for interval in (self.eval_interval, self.log_interval):
            interval.start(state.timestamp, state.progress)
        # batch ends compute the run's progress only when an interval is a fraction of it
        self._intervals_need_progress = self.eval_interval.needs_progress or self.log_interval.needs_progress
        self._next_due = self._next_batch_due()
        state.model.train()
        old_handlers = self._install_signals()
        try:
            run(FIT_START)
            while not state.is_done() and not state.stop_training:
                ts = state.timestamp
                mid_epoch = ts.batch_in_epoch > 0
                if not mid_epoch:
                    run(EPOCH_START)
                state.steps_per_epoch = len(loader) if hasattr(loader, "__len__") else None
                batches = epoch_iterator(loader, state.seed, ts.epoch, ts.batch_in_epoch)
                if self._run_epoch(batches):
                    self._end_epoch()
            self._finish()
        except RuntimeError as e:
            lost = self._lost_ranks() if self.world.size > 1 else []
            if not lost:
                raise
            raise TrainingError(f"rank {self.world.rank}: rank {', '.join(map(str, lost))} of the run is gone "
                                f"(a collective failed: {str(e).splitlines()[0][:200]}); stopping. The last good "
                                f"checkpoint: {state.last_checkpoint or 'none'}") from e
        finally:
            if self._vote_work is not None:   # the last step's vote, still in flight: finish it before the
                try:                          # process group can be torn down (else gloo aborts the process)
                    self._vote_work.wait()
                except RuntimeError:
                    pass                      # a lost rank: already reported above
                self._vote_work = None
            self._restore_signals(old_handlers)
            if self.checkpointer is not None:
                self.checkpointer.release()
        return state

    def _run_epoch(self, batches) -> bool:
        """One epoch, a batch at a time, top to bottom, with the events between the lines.
        True when the data ran out, False when training must stop. `on` is the set of events
        somebody listens to: an event nobody listens to costs that one look-up."""
        state, fire, on, perf_counter = self.state, self.engine.run, self.engine.active, time.perf_counter
        on_cpu, device, batch_fn, count_tokens = self._on_cpu, self.device, self.batch_fn, self.count_tokens
        optimizers, scaler, advance, step = state.optimizers, state.scaler, state.timestamp.advance, self._step
        progress_schedules, batch_schedulers, shared = self._progress_schedules, self._batch_schedulers, self._sharding
        while True:
            if BEFORE_DATALOADER in on: fire(BEFORE_DATALOADER)                        # noqa: E701
            t0 = perf_counter()
            try:
                batch = next(batches)                                  # fetch
            except StopIteration:
                return True
            except Exception:
                if self._stop_on_signal():   # Ctrl-C reached loader workers too: the last step is saved
                    return False
                raise
            if shared is not None:                                     # data parallel: this rank's share
                batch = self._take_share(batch)
            state.batch = batch if on_cpu else to_device(batch, device)
            if AFTER_DATALOADER in on: fire(AFTER_DATALOADER)                          # noqa: E701
            for sched in progress_schedules:                           # learning rate (and more) from progress
                sched.apply(state)
            if BATCH_START in on: fire(BATCH_START)                                    # noqa: E701
            batch = state.batch
            n_samples = batch[0].shape[0] if type(batch) is tuple or type(batch) is list else batch_size(batch)
            n_tokens = count_tokens(batch_fn(batch)[1])
            if shared is not None:                                     # the clock counts all ranks' samples
                n_samples, n_tokens = self._count_all_ranks(n_samples, n_tokens)
            step(state)                                                # forward, loss, reduce, backward
            if BEFORE_OPTIM_STEP in on: fire(BEFORE_OPTIM_STEP)        # noqa: E701  gradient clipping here
            if scaler is None:
                for opt in optimizers:
                    opt.step()
            else:
                for opt in optimizers:
                    scaler.step(opt)
                scaler.update()
            if AFTER_OPTIM_STEP in on: fire(AFTER_OPTIM_STEP)                          # noqa: E701
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            for sched in batch_schedulers:                             # torch schedulers: once per batch
                sched.step()
            advance(n_samples, n_tokens, perf_counter() - t0)
            if self._after_batch():                                    # log, evaluate, checkpoint; stop?
                return self._epoch_complete()

    def _share_loader(self, loader, purpose: str = "training") -> "sharding.Sharding":
        """How the ranks share `loader`'s batches (hasten's loaders then load only this rank's part)."""
        shared = sharding.prepare(loader, self.world.rank, self.world.size, purpose)
        if shared.mode == "trainer" and purpose == "training" and self.world.is_main:
            warnings.warn("the training loader yields whole global batches: every rank loads each batch and keeps "
                          "its share. To load only the share, use hasten.data.make_dataloader or DeviceLoader, or a "
                          "DistributedSampler with the per-rank batch size (docs/distributed.md)", stacklevel=3)
        return shared

    def _take_share(self, batch):
        """This rank's share of the step's global batch (the loader may have taken it already),
        and the global batch's size in `state.global_batch_size`."""
        shared, world, ts = self._sharding, self.world, self.state.timestamp
        if shared.mode == "trainer":
            self.state.global_batch_size = batch_size(batch)
            return shard_batch(batch, world.rank, world.size)
        self.state.global_batch_size = shared.global_size(ts.epoch, ts.batch_in_epoch, batch_size(batch), world.size)
        return batch

    def _count_all_ranks(self, n_samples: int, n_tokens: int) -> tuple[int, int]:
        """Under data parallelism: the step's samples and tokens on all ranks (the clock counts the
        global batch, so durations mean the same at any world size; tokens are this rank's scaled
        to the global batch, exact for batches of equal-length sequences), and the weight of this
        rank's mean in DDP's average (its share of the global batch, times the world size)."""
        n = self.state.global_batch_size
        self._rank_scale = n_samples / n * self.world.size if n else 0.0
        return n, (n_tokens * n // n_samples if n_samples else 0)

    def _forward_backward(self, state: State) -> None:
        """The default step (algorithms may wrap it): forward, loss, reduction and backward
        of every micro-batch; `micro_batch_weight` is a micro-batch's share of the step's
        samples. Under data parallelism `state.batch` is this rank's share of the global batch
        (taken at fetch), its micro-batches weighted by the rank's share (`_rank_scale`) so that
        DDP's gradient average is the global mean, and gradients are all-reduced on the last
        micro-batch only (what `no_sync` does)."""
        fire, on, autocast, batch_fn = self.engine.run, self.engine.active, self._autocast_ctx, self.batch_fn
        batch, k, grad_sync, scale = state.batch, state.grad_accum, self._grad_sync, self._rank_scale
        micros = (batch,) if k == 1 else split_batch(batch, k)
        total = batch_size(batch) if k > 1 or scale != 1.0 else 0
        for i, micro in enumerate(micros):
            state.micro_batch, state.micro_batch_index = micro, i
            state.micro_batch_weight = batch_size(micro) / total * scale if total else scale
            if grad_sync is not None:
                grad_sync(i == k - 1)                                  # reduce across ranks on the last only
            if BEFORE_FORWARD in on: fire(BEFORE_FORWARD)                              # noqa: E701
            inputs, targets = batch_fn(state.micro_batch)
            with autocast:
                state.outputs = forward(state.forward_model, inputs)
            if AFTER_FORWARD in on: fire(AFTER_FORWARD)                                # noqa: E701
            if BEFORE_LOSS in on: fire(BEFORE_LOSS)                                    # noqa: E701
            with autocast:
                state.loss = self._training_loss(state.outputs, targets)
            state.loss_count = state.loss.numel()
            if AFTER_LOSS in on: fire(AFTER_LOSS)                      # noqa: E701  per-sample losses: reweight, drop
            state.loss = loss = self.reduce_loss(state.loss)
            state.step_losses.append(loss.detach())                    # read at log points only
            if BEFORE_BACKWARD in on: fire(BEFORE_BACKWARD)                            # noqa: E701
            (loss if state.scaler is None else state.scaler.scale(loss)).backward()
            if AFTER_BACKWARD in on: fire(AFTER_BACKWARD)                              # noqa: E701

    def _epoch_complete(self) -> bool:
        """After a stop: the epoch is complete when its last batch was the stopping point."""
        spe = self.state.steps_per_epoch
        return not self._signal.is_set() and spe is not None and self.state.timestamp.batch_in_epoch >= spe

    def _training_loss(self, outputs, targets) -> torch.Tensor:
        """The training loss (the task's loss as algorithms wrapped it); the default loss's
        mean inside the kernel when nobody reads per-sample losses."""
        try:
            loss = (default_loss(outputs, targets, reduction="mean") if self._fused_mean
                    else self.state.train_loss_fn(outputs, targets))
        except _LOSS_FAULTS as e:
            raise loss_fault(e, outputs, targets) from e
        if not isinstance(loss, torch.Tensor):
            raise loss_fault(None, outputs, targets, loss)
        return loss

    def reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Mean over the samples of the whole step: sum / count, weighted by micro-batch share.

        `loss_count` is the number of elements before algorithms changed them: an algorithm
        that zeroes or drops samples keeps them in the denominator; one that reweights
        (InfoBatch) scales them.
        """
        state = self.state
        if loss.dim() == 0:
            return loss * state.micro_batch_weight if state.micro_batch_weight != 1.0 else loss
        if state.micro_batch_weight == 1.0 and loss.numel() == state.loss_count:
            return loss.mean()
        if not state.loss_count:   # an empty share (a global batch smaller than the world): nothing to learn
            return loss.sum()
        return loss.sum() * (state.micro_batch_weight / state.loss_count)

    def _after_batch(self) -> bool:
        """Batch end: log, evaluate, checkpoint. True when training must stop now."""
        state, run, on = self.state, self.engine.run, self.engine.active
        ts = state.timestamp
        if ts.batch < self._next_due:   # no log, evaluation or end of a batch-counted run is due
            if BATCH_END in on: run(BATCH_END)                                         # noqa: E701
            if CHECKPOINT in on: run(CHECKPOINT)                                       # noqa: E701
            return (self._votes is not None or self._signal.is_set()) and self._stop_on_signal() or state.stop_training
        progress = state.progress if self._intervals_need_progress else 0.0
        state.log_due = self.log_interval.due(ts, progress)
        eval_due = self.eval_interval.due(ts, progress) and self._has_eval()
        if state.log_due or eval_due:
            self._end_segment()   # the training clock is read here: the device's queued work counts in it
        run(BATCH_END)
        if state.log_due:
            self._log_train()
        if eval_due:
            self._evaluate_during_fit()
        run(CHECKPOINT)
        state.log_due = False
        self._next_due = self._next_batch_due()
        return self._stop_on_signal() or state.is_done() or state.stop_training

    def _stop_on_signal(self) -> bool:
        """True (after saving a checkpoint) when SIGTERM or a first Ctrl-C arrived. Under data
        parallelism a signal may reach the ranks at different steps (or one rank only), so they
        vote: each step end starts a small asynchronous all-reduce of "a signal arrived here"
        and reads the previous step's, so every rank stops, and rank 0 saves, at the same step."""
        if self._votes is not None:
            if not self._agree_on_signal():
                return False
            self._signal.set()
        if self._signal.is_set():
            if not self.state.stop_training:
                self._save_on_signal()
            return True
        return False

    def _lost_ranks(self) -> list[int]:
        """The other ranks on this machine whose process is gone (ranks elsewhere cannot be
        checked from here)."""
        import socket

        import torch.distributed as dist
        lost, host = [], socket.gethostname()
        try:
            store = dist.distributed_c10d._get_default_store()
        except Exception:
            return []
        for r in range(self.world.size):
            if r == self.world.rank:
                continue
            try:
                where, pid = store.get(f"hasten/rank{r}").decode().rsplit(" ", 1)
            except Exception:
                continue
            if where == host and not _process_alive(int(pid)):
                lost.append(r)
        return lost

    def _agree_on_signal(self) -> bool:
        """The ranks' vote of the previous step end (the same answer on every rank); starts this one's."""
        import torch.distributed as dist
        agreed = False
        if self._vote_work is not None:
            self._vote_work.wait()   # started a whole step ago: long done
            agreed = bool(self._vote_box.item())
        self._vote_box.fill_(int(self._signal.is_set()))
        self._vote_work = dist.all_reduce(self._vote_box, op=dist.ReduceOp.MAX, group=self._votes, async_op=True)
        return agreed

    def _next_batch_due(self) -> float:
        """The next batch count at which a batch end must check the log and eval intervals
        and the end of the run; 0 (check every batch) when one of them is not counted in
        batches or epochs, or when batch ends compute the run's progress."""
        state = self.state
        if self._intervals_need_progress:
            return 0
        unit = state.max_duration.unit
        if unit == TimeUnit.BATCH:
            end = state.max_duration.value
        elif unit == TimeUnit.EPOCH:
            end = math.inf   # epoch-counted runs end at an epoch end
        else:
            return 0
        dues = [self.log_interval.next_batch_due(), self.eval_interval.next_batch_due() if self._has_eval() else math.inf]
        if None in dues:
            return 0
        return min(end, *dues)

    def _end_epoch(self) -> None:
        state, run = self.state, self.engine.run
        ts = state.timestamp
        ts.epoch += 1
        ts.batch_in_epoch = ts.sample_in_epoch = ts.token_in_epoch = 0
        state.at_epoch_end = True
        eval_due = self.eval_interval.due(ts, state.progress, epoch_end=True) and self._has_eval()
        if eval_due:
            self._end_segment()
        run(EPOCH_END)
        if eval_due:
            self._evaluate_during_fit()
        run(CHECKPOINT)
        state.at_epoch_end = False

    def _end_segment(self) -> None:
        """End a timed training segment with the device's queued work done, and count the wait
        as training time. Steps time the host only (no synchronisation inside a step), so on
        a GPU the work still queued when the clock is read (a log point, an evaluation, the
        end of fit) would otherwise fall in no segment. A no-op on the CPU."""
        sync = self.runtime.device_synchronize
        if sync is not None:
            t = time.perf_counter()
            sync()
            self.state.timestamp.train_seconds += time.perf_counter() - t

    def _finish(self) -> None:
        state = self.state
        self._end_segment()
        self._log_train()
        if self._has_eval() and self._evaluated_at != state.timestamp.batch and not self._signal.is_set():
            self._evaluate_during_fit()
        self.engine.run(FIT_END)
        self.logger.flush(state.timestamp.batch)

    def _log_train(self) -> None:
        state = self.state
        loss = state.read_train_loss()
        if loss is not None and self.world.size > 1:
            loss = self._sum_over_ranks(loss) / self.world.size   # each rank holds its weighted share
        if loss is not None:
            self.logger.log({"train/loss": loss, "train/lr": state.lr(), "train/epoch": state.timestamp.epoch,
                             "time/train_seconds": state.timestamp.train_seconds})
        self.logger.flush(state.timestamp.batch)

    def _sum_over_ranks(self, *values: float) -> "float | tuple":
        """The sums over all ranks (one all-reduce; at log and evaluation points only)."""
        import torch.distributed as dist
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        out = tuple(t.tolist())
        return out[0] if len(out) == 1 else out

    def _has_eval(self) -> bool:
        return self.eval_dataloader is not None

    def _evaluate_during_fit(self) -> None:
        self.evaluate()
        self._evaluated_at = self.state.timestamp.batch

    # ------------------------------------------------------------------ signals
    def _install_signals(self):
        """SIGTERM and a first Ctrl-C (SIGINT) ask for a checkpoint at the end of the current
        step and a clean stop; a second Ctrl-C stops at once (KeyboardInterrupt)."""
        if threading.current_thread() is not threading.main_thread():
            return None
        self._signal.clear()
        self._signal_name = None

        def on_signal(signum, frame):
            if signum == signal.SIGINT and self._signal.is_set():
                signal.signal(signal.SIGINT, signal.default_int_handler)
                raise KeyboardInterrupt
            self._signal_name = "sigint" if signum == signal.SIGINT else "sigterm"
            self._signal.set()
            if signum == signal.SIGINT:
                print("\nCtrl-C: saving a checkpoint at the end of this step, then stopping "
                      "(press Ctrl-C again to stop at once, without saving)", file=sys.stderr, flush=True)

        return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _restore_signals(self, old) -> None:
        for sig, handler in (old or {}).items():
            signal.signal(sig, handler)

    def _save_on_signal(self) -> None:
        state = self.state
        what = "Ctrl-C" if self._signal_name == "sigint" else "SIGTERM"
        state.stop_training, state.stop_reason = True, self._signal_name or "sigterm"
        if not (self.world.is_main or self.world.sharded):   # a sharded model is gathered by every rank
            return
        if self.checkpointer is None:
            if self.world.is_main:
                warnings.warn(f"{what} received: training stopped; no save_folder, so no checkpoint was written")
            return
        path = self.checkpointer.save(state)
        if self.world.is_main:
            print(f"{what} received: checkpoint written to {path}; resume with autoresume=True", flush=True)

    # ------------------------------------------------------------------ evaluate / predict
    @torch.inference_mode()
    def evaluate(self, dataloader: Iterable | None = None, prefix: str = "val") -> dict[str, float]:
        """Mean loss over all samples (or tokens) and the metrics, under inference mode."""
        state, run = self.state, self.engine.run
        dataloader = dataloader if dataloader is not None else self.eval_dataloader
        if dataloader is None:
            raise ValueError("evaluate() needs a dataloader (or eval_dataloader= on the Trainer)")
        was_training = state.model.training
        state.model.eval()
        metrics = {k: m.to(self.device) for k, m in self.metrics.items()}
        for m in metrics.values():
            m.reset()
        train_forward, state.forward_model = state.forward_model, self._eval_model
        run(EVAL_START)
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        count, world = 0, self.world
        shared = self._share_loader(dataloader, "evaluation") if world.size > 1 else None
        for batch in dataloader:
            if shared is not None:   # each rank evaluates its share of every batch: every sample counted once
                if shared.mode == "trainer":
                    batch = shard_batch(batch, world.rank, world.size)
                if batch_size(batch) == 0:
                    if not world.sharded:
                        continue
                    forward(state.forward_model, self.batch_fn(to_device(batch, self.device))[0])   # FSDP: every
                    continue                                       # rank joins every forward's parameter gathers
            batch = to_device(batch, self.device)
            state.batch = batch
            run(EVAL_BATCH_START)
            inputs, targets = self.batch_fn(state.batch)
            with self.runtime.autocast():
                outputs = forward(state.forward_model, inputs)
                state.outputs = outputs
                if targets is not None:
                    try:
                        loss = state.loss_fn(outputs, targets)
                    except _LOSS_FAULTS as e:
                        raise loss_fault(e, outputs, targets) from e
                    if not isinstance(loss, torch.Tensor):
                        raise loss_fault(None, outputs, targets, loss)
                    loss_sum += loss.double().sum()
                    count += loss.numel()
            if targets is not None:
                for m in metrics.values():
                    m.update(outputs.float() if outputs.is_floating_point() else outputs, targets)
            run(EVAL_BATCH_END)
        results = {}
        total_loss = float(loss_sum)
        if world.size > 1:   # metrics synchronise themselves in compute() (torchmetrics)
            total_loss, count = self._sum_over_ranks(total_loss, float(count))
        if count:
            results[f"{prefix}/loss"] = total_loss / count
        for name, m in metrics.items():
            results[f"{prefix}/{name}"] = float(m.compute())
        state.eval_metrics = results
        # when, in training time, this evaluation happened (quality against time from the log
        # alone); its own key, since the training record of the same step has time/train_seconds
        self.logger.log({**results, "time/train_seconds_at_eval": state.timestamp.train_seconds})
        run(EVAL_END)
        state.forward_model = train_forward
        self.logger.flush(state.timestamp.batch)
        if was_training:
            state.model.train()
        return results

    @torch.inference_mode()
    def predict(self, dataloader: Iterable) -> list:
        """Model outputs for every batch (on the CPU), in order."""
        state, run = self.state, self.engine.run
        was_training = state.model.training
        state.model.eval()
        run(PREDICT_START)
        outs = []
        for batch in dataloader:
            state.batch = to_device(batch, self.device)
            inputs, _ = self.batch_fn(state.batch) if isinstance(batch, (list, tuple, dict)) else (state.batch, None)
            with self.runtime.autocast():
                state.outputs = forward(state.forward_model, inputs)
            run(PREDICT_BATCH_END)
            outs.append(state.outputs.detach().cpu() if isinstance(state.outputs, torch.Tensor) else state.outputs)
        run(PREDICT_END)
        if was_training:
            state.model.train()
        return outs

    def close(self) -> None:
        self.logger.close()
