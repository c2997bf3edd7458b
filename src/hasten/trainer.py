"""The Trainer: the textbook training loop, with named events between its lines.

Read `fit`, `_run_epoch` (one batch: fetch, schedules, step, optimizer, advance, batch end)
and `_forward_backward` (the micro-steps: forward, loss, reduce, backward) top to bottom:
everything a method changes happens in an Algorithm at one of the events (or through the
step and loss seams), and everything that watches happens in a Callback.
"""
from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from .arguments import check_loader, listed
from .assembly import (CheckpointOptions, Durations, ParallelOptions, Parts, StepOptions, assemble,
                       captures_cuda_graphs, newest_in, on_this_rank, resume_from, runtime_for)
from .checkpoint import save
from .core import Algorithm, Event, State, Time, TimeUnit
from .data.batches import (batch_size, cut, forward, shard_batch, share_range, split_batch, to_device)
from .data.resumable import epoch_iterator
from .data.sharding import RankShare, last_batch_size, own_sharing
from .distributed.world import all_sum
from .errors import CheckpointError, TrainingError
from .loss import IGNORE_INDEX, checked_loss, default_loss, logits_of
from .microbatch import ActivationBudget, ActivationLimitError, StepSnapshot, average_gradients, halved, micro_count, parse_bytes
from .models import has_batch_norm
from .optim.compiled import compile_steps, hold_lrs
from .runtime import Runtime

# Events as module constants: looking members up on an Enum class is slow in Python 3.11.
(AFTER_BACKWARD, AFTER_DATALOADER, AFTER_FORWARD, AFTER_LOSS, AFTER_OPTIM_STEP, BATCH_END, BATCH_START, BEFORE_BACKWARD, BEFORE_DATALOADER, BEFORE_FORWARD, BEFORE_LOSS, BEFORE_OPTIM_STEP, CHECKPOINT, EPOCH_END, EPOCH_START, EVAL_BATCH_END, EVAL_BATCH_START, EVAL_END, EVAL_START, FIT_END, FIT_START, INIT, PREDICT_BATCH_END, PREDICT_END, PREDICT_START) = (
    Event.AFTER_BACKWARD, Event.AFTER_DATALOADER, Event.AFTER_FORWARD, Event.AFTER_LOSS, Event.AFTER_OPTIM_STEP, Event.BATCH_END, Event.BATCH_START, Event.BEFORE_BACKWARD, Event.BEFORE_DATALOADER, Event.BEFORE_FORWARD, Event.BEFORE_LOSS, Event.BEFORE_OPTIM_STEP, Event.CHECKPOINT, Event.EPOCH_END, Event.EPOCH_START, Event.EVAL_BATCH_END, Event.EVAL_BATCH_START, Event.EVAL_END, Event.EVAL_START, Event.FIT_END, Event.FIT_START, Event.INIT, Event.PREDICT_BATCH_END, Event.PREDICT_END, Event.PREDICT_START)


def _marking_graph_steps(step: Callable) -> Callable:
    """`step`, each call first starting a new iteration of the CUDA graphs (their outputs from
    the last call may then be overwritten): one mark per training step, warm-up steps too."""
    def marked(state):
        torch.compiler.cudagraph_mark_step_begin()
        step(state)
    return marked


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
    algorithms, callbacks, loggers: lists of instances (hasten.algorithms, hasten.callbacks,
        hasten.loggers, or your own subclasses); one alone is taken as a list of one. Anything
        else (a name, a class) is a TypeError that says so before anything is built.
    schedulers: hasten schedules (functions of training progress, see hasten.optim), torch
        LR schedulers (stepped once per batch), or factories `f(optimizer) -> scheduler`.
    loss_fn: `loss_fn(outputs, targets)` returning per-sample (or per-token) losses, or a
        scalar. The Trainer reduces: the mean over all samples of the step, across
        micro-batches, so grad_accum=k equals one batch k times larger.
    sync_batchnorm: under data parallelism, normalise batch-norm layers over the whole global
        batch (torch.nn.SyncBatchNorm, CUDA only in torch 2.13) instead of each rank's share.
    fsdp: under parallelism 'fsdp', hasten.distributed.FSDPOptions or a dict of them
        (reshard_after_forward, blocks, checkpoint); see docs/distributed.md.
    host_allocator: 'default' (the default) leaves glibc malloc as it is; 'auto' tunes its
        thresholds when training on the CPU (what `hasten train` does), 'tuned' whatever the
        device (see hasten.allocator).
    quality: (metric, 'max' or 'min'), what judges the run where something must choose (EMA
        and SWA keep the average only if it evaluates better); default ('val/loss', 'min').
    microbatch: compute each step in micro-batches of this many samples (the step is the same;
        memory falls), or 'auto': the whole batch, halved and the step redone whenever it runs
        out of memory (hasten.microbatch). Not with grad_accum.
    memory_limit: on a CPU, the bytes of activations one micro-batch may save for backward
        (e.g. '512MB'); more is out of memory, as on a GPU (what microbatch='auto' reacts to).
    activation_checkpointing: recompute each block's activations in the backward pass instead of
        keeping them (less memory, about one more forward of time), with or without FSDP.
    on_logger_error: 'continue' (the default): a logger that raises is switched off with one
        warning and training goes on; 'stop': the run stops cleanly at the end of the step, with
        a checkpoint, as on SIGTERM.
    compile_optimizer: run each optimizer's step under torch.compile (a dict: its keyword
        arguments); learning rates are then held as tensors on the parameters' device, which
        the schedules write in place, so the step compiles once (hasten.optim.compiled).

    The keywords are the option groups of hasten.assembly.options (Durations, StepOptions,
    CheckpointOptions, ParallelOptions), where each is declared once with its range and
    docstring, and are handed to `hasten.assembly.assemble`, the one place a run is put
    together; `Trainer.from_parts(assemble(...))` is the same Trainer without the keywords. The
    Trainer holds those parts (`trainer.parts`) and reads them through the attributes below.
    """

    def __init__(self, model: "torch.nn.Module | Callable[[], torch.nn.Module]", train_dataloader: Iterable | None = None,
                 optimizers: Any = None, schedulers: Any = None, loss_fn: Callable | None = None,
                 max_duration: "str | Time" = Durations.max_duration, eval_dataloader: Iterable | None = None,
                 eval_interval: "str | Time" = Durations.eval_interval, metrics: dict | None = None,
                 algorithms: Sequence = (), callbacks: Sequence = (), loggers: Sequence = (),
                 precision: str | None = None, device: "str | torch.device | None" = None,
                 compile: "bool | dict" = StepOptions.compile, grad_accum: int = StepOptions.grad_accum,
                 grad_clip_norm: float | None = StepOptions.grad_clip_norm, seed: int | None = None,
                 save_folder: str | None = CheckpointOptions.save_folder,
                 save_interval: "str | Time | None" = CheckpointOptions.save_interval,
                 load_path: str | None = CheckpointOptions.load_path, autoresume: bool = CheckpointOptions.autoresume,
                 load_min_share: float = CheckpointOptions.load_min_share,
                 log_interval: "str | Time" = Durations.log_interval, batch_fn: Callable = StepOptions.batch_fn,
                 count_tokens: Callable = StepOptions.count_tokens, checkpoint_io=CheckpointOptions.io,
                 host_allocator: str | None = None, runtime: Runtime | None = None,
                 sync_batchnorm: bool = ParallelOptions.sync_batchnorm, fsdp: "dict | None" = None,
                 quality: "tuple[str, str] | None" = None, microbatch: "int | str | None" = StepOptions.microbatch,
                 memory_limit: "int | str | None" = StepOptions.memory_limit,
                 activation_checkpointing: bool = StepOptions.activation_checkpointing,
                 compile_optimizer: "bool | dict" = StepOptions.compile_optimizer,
                 on_logger_error: str = Durations.on_logger_error):
        step = StepOptions(grad_accum=grad_accum, grad_clip_norm=grad_clip_norm, compile=compile, batch_fn=batch_fn,
                           count_tokens=count_tokens, microbatch=microbatch, memory_limit=memory_limit,
                           activation_checkpointing=activation_checkpointing, compile_optimizer=compile_optimizer)
        self._adopt(assemble(
            model, runtime_for(runtime, device=device, precision=precision, seed=seed, host_allocator=host_allocator),
            train_dataloader=train_dataloader, eval_dataloader=eval_dataloader, optimizers=optimizers,
            schedulers=schedulers, loss_fn=loss_fn, metrics=metrics, algorithms=algorithms, callbacks=callbacks,
            loggers=loggers, durations=Durations(max_duration=max_duration, eval_interval=eval_interval,
                                                 log_interval=log_interval, on_logger_error=on_logger_error), step=step,
            checkpoints=CheckpointOptions(save_folder=save_folder, save_interval=save_interval, load_path=load_path,
                                          autoresume=autoresume, io=checkpoint_io, load_min_share=load_min_share),
            parallel=ParallelOptions(sync_batchnorm=sync_batchnorm, fsdp=fsdp or {}), quality=quality))

    @classmethod
    def from_parts(cls, parts: Parts) -> "Trainer":
        """A Trainer over parts `hasten.assembly.assemble` made (what hasten.build does)."""
        trainer = cls.__new__(cls)
        trainer._adopt(parts)
        return trainer

    # the parts, as the Trainer reads them (hasten.assembly.Parts holds them)
    state = property(lambda self: self.parts.state, doc="The training state (hasten.core.State).")
    engine = property(lambda self: self.parts.engine, doc="The event engine: algorithms and callbacks in order.")
    logger = property(lambda self: self.parts.logger, doc="The loggers (a LogHub).")
    runtime = property(lambda self: self.parts.runtime, doc="Device, precision, seed, world (hasten.Runtime).")
    world = property(lambda self: self.parts.runtime.world, doc="This process's place among the run's processes.")
    device = property(lambda self: self.parts.runtime.device, doc="The device the run trains on.")
    metrics = property(lambda self: self.parts.metrics, doc="The evaluation metrics, by name.")
    eval_interval = property(lambda self: self.parts.eval_interval, doc="When to evaluate (an Interval).")
    log_interval = property(lambda self: self.parts.log_interval, doc="When to log (an Interval).")
    checkpoint_io = property(lambda self: self.parts.checkpoint_io, doc="What writes and reads checkpoints.")
    checkpointer = property(lambda self: self.parts.checkpointer, doc="The Checkpoint callback, or None.")
    save_folder = property(lambda self: self.parts.save_folder, doc="Where checkpoints go, or None.")
    batch_fn = property(lambda self: self.parts.step.batch_fn, doc="batch -> (inputs, targets).")
    count_tokens = property(lambda self: self.parts.step.count_tokens, doc="A step's targets -> its tokens.")
    grad_clip_norm = property(lambda self: self.parts.step.grad_clip_norm, doc="The gradient norm clipped to, or None.")
    host_allocator = property(lambda self: self.parts.runtime.allocator_report, doc="What was done to malloc.")

    @property
    def eval_dataloader(self):
        """The evaluation batches, or None (no evaluation)."""
        return self.parts.eval_dataloader

    @eval_dataloader.setter
    def eval_dataloader(self, loader) -> None:
        self.parts.eval_dataloader = loader

    def _adopt(self, parts: Parts) -> None:
        self.parts = parts
        self._eval_model, self._grad_sync = parts.prepared.eval_model, parts.prepared.grad_sync
        self._stop = parts.stop
        # said after the checkpoint a signal wrote; hasten train prints its own (`--resume RUN`)
        self.resume_hint = "resume with autoresume=True"
        self.state.evaluate = self._evaluate_for_algorithms if parts.eval_dataloader is not None else None
        self._on_cpu = self.device.type == "cpu"   # CPU batches need no move
        self._count_targets, self._step_loss = False, None   # set for each fit (_prepare_step)
        self._budget = parse_bytes(parts.step.memory_limit)   # trainer.memory_limit: activation bytes a micro-batch may save
        self._compiled = bool(parts.step.compile)
        self._compile_optimizer = parts.step.compile_optimizer
        # CUDA graphs (compile modes reduce-overhead, max-autotune on a GPU): the step marks its
        # start (_prepare_step), so the last step's graph outputs may be overwritten
        self._graph_steps = captures_cuda_graphs(parts.step.compile, self.device)
        self._warm_pending, self._graphs_after_warmup = False, None
        self._eval_micro = None   # microbatch='auto': the evaluation batch size found to fit (None: whole)
        self._attach(self.state.callbacks)
        self._share: RankShare | None = None      # data parallel: this rank's share of each batch (set by fit)
        self._evaluated_at: int | None = None     # batch of the last evaluation during fit

    # ------------------------------------------------------------------ adding and describing
    def add_callbacks(self, *callbacks) -> None:
        """Add callbacks after the Trainer is built (they observe from the next event on); under
        data parallelism those that write (`main_rank_only`) run on rank 0 only."""
        added = on_this_rank(callbacks, self.world, self.checkpointer)
        self.state.callbacks.extend(added)
        self._attach(added)
        self.engine.rebuild()

    def _attach(self, callbacks) -> None:
        """Callbacks that time the events themselves (Profile) get the engine whose dispatches they time."""
        for cb in callbacks:
            if hasattr(cb, "attach"):
                cb.attach(self.engine)

    def add_algorithms(self, *algorithms) -> None:
        """Add algorithms after the Trainer is built, before fit. One that listens to INIT
        (model surgery) must be given to the constructor: INIT has already run."""
        algorithms = listed("algorithms", algorithms)
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
        if Path(path).is_dir() and not getattr(self.checkpoint_io, "writes_folder", False):
            raise CheckpointError(f"save_checkpoint: {path} is a folder; give a file in it, e.g. "
                                  f"{Path(path) / 'final.pt'}")
        return save(self.state, path, self.checkpoint_io, write=self.world.is_main)

    def load_checkpoint(self, path) -> dict:
        """Continue from a checkpoint: a file, a sharded checkpoint folder, or a folder of
        checkpoints (a save_folder or a run folder: its newest that loads)."""
        path = newest_in(path, self.checkpoint_io)
        return resume_from(self.state, self.logger, path, self.checkpoint_io.load(path))

    # ------------------------------------------------------------------ fit
    def fit(self, summary: bool = True) -> State:
        """Train to max_duration (or until something stops the run); returns the state. With
        `summary` (the default) one line on standard error says what was done: batches, time,
        final metrics (the `hasten` command prints its own and passes False)."""
        t0 = time.perf_counter()
        state, run = self.state, self.engine.run
        if state.train_dataloader is None:
            raise ValueError("fit() needs a train_dataloader")
        loader = state.train_dataloader
        if hasattr(loader, "__len__") and len(loader) == 0:
            raise TrainingError(empty_loader_message(loader, state.timestamp.epoch))
        self._prepare_step(loader)
        state.steps_per_epoch = len(loader) if hasattr(loader, "__len__") else None
        for interval in (self.eval_interval, self.log_interval):
            interval.start(state.timestamp, state.progress)
        # batch ends compute the run's progress only when an interval is a fraction of it
        self._intervals_need_progress = self.eval_interval.needs_progress or self.log_interval.needs_progress
        self._next_due = self._next_batch_due()
        self._warm_pending = self._compiled   # compiled: every shape of the run compiled before the first step
        state.data_seconds, state.fit_train_seconds = 0.0, state.timestamp.train_seconds   # this fit's data wait
        self._logged_at = (0.0, state.timestamp.train_seconds)
        state.model.train()
        self._stop.install()
        try:
            run(FIT_START)
            while not state.is_done() and not state.stop_training:
                ts = state.timestamp
                mid_epoch = ts.batch_in_epoch > 0
                if not mid_epoch:
                    run(EPOCH_START)
                state.steps_per_epoch = len(loader) if hasattr(loader, "__len__") else None
                batches = epoch_iterator(loader, state.seed, ts.epoch, ts.batch_in_epoch, restored=state.loader_restored)
                state.loader_restored = False   # the next epoch starts afresh
                if self._run_epoch(batches):
                    self._end_epoch()
            self._finish()
        except RuntimeError as e:
            lost = self._stop.lost_ranks()
            if not lost:
                raise
            raise TrainingError(f"rank {self.world.rank}: rank {', '.join(map(str, lost))} of the run is gone "
                                f"(a collective failed: {str(e).splitlines()[0][:200]}); stopping. The last good "
                                f"checkpoint: {state.last_checkpoint or 'none'}") from e
        finally:
            self._stop.close()
            if self.checkpointer is not None:
                self.checkpointer.release()
        if self._graphs_after_warmup is not None:
            late = compiled_graphs() - self._graphs_after_warmup
            self.logger.log({"compile/graphs_after_warmup": late})
            self.logger.flush(state.timestamp.batch)
            state.compile_graphs_after_warmup = late
            if late:
                warnings.warn(f"compile: {late} graph(s) were compiled during timed training, for shapes the warm-up "
                              "did not see (e.g. a last, smaller batch: data.drop_last=true avoids it)", stacklevel=2)
        if summary and self.world.is_main:
            print(fit_summary(state, time.perf_counter() - t0), file=sys.stderr, flush=True)
        return state

    def _prepare_step(self, loader) -> None:
        """What every step of this fit uses, built once: the step wrapped by the algorithms,
        the training loss (the loss seam), the autocast context, the rank's share."""
        state = self.state
        step = self._forward_backward
        for algo in state.algorithms:
            step = algo.wrap_step(step)
        if self._graph_steps:   # each try of a step starts a new generation of the CUDA graphs' outputs
            step = _marking_graph_steps(step)
        self._step = self._redo_when_out_of_memory(step) if state.microbatch_auto else step
        # the training loss: the task's loss wrapped by every algorithm, built once (the loss seam)
        train_loss = state.loss_fn
        for algo in state.algorithms:
            train_loss = algo.wrap_loss(train_loss)
        state.train_loss_fn = train_loss
        # the default loss with nobody reading per-sample losses: the mean inside the loss kernel
        fused_mean = (state.grad_accum == 1 and state.microbatch is None and Event.AFTER_LOSS not in self.engine.active
                      and train_loss is default_loss and self.world.size == 1)
        # otherwise the step's per-target losses are divided by its counted targets (reduce_loss)
        self._count_targets = not fused_mean
        # what the step calls for its loss (checked: a failing or non-tensor loss is a one-line error)
        self._step_loss = functools.partial(default_loss, reduction="mean") if fused_mean else train_loss
        self._autocast_ctx = self.runtime.autocast()   # one context for every step (fp32: a shared no-op)
        # each optimizer's step: compiled, its learning rates held as tensors the schedules fill in
        # place; else eager, learning rates as floats (a compiled run's checkpoint resumes either way)
        state.optimizer_compiled = bool(self._compile_optimizer)
        if self._compile_optimizer:
            kwargs = self._compile_optimizer if isinstance(self._compile_optimizer, dict) else {}
            # the steps compile in the first training step (the harness's warm-up); graphs after it count
            self._optimizer_steps = compile_steps(state.optimizers, **kwargs) + [self._optimizers_compiled]
        else:
            hold_lrs(state.optimizers, as_tensors=False)
            self._optimizer_steps = [opt.step for opt in state.optimizers]
        self._share = RankShare(loader, self.world) if self.world.size > 1 else None
        self._progress_schedules = [s for s in state.schedulers if hasattr(s, "apply")]
        self._batch_schedulers = [s for s in state.schedulers if not hasattr(s, "apply")]

    def _run_epoch(self, batches) -> bool:
        """One epoch, a batch at a time, top to bottom, with the events between the lines.
        True when the data ran out, False when training must stop. `on` is the set of events
        somebody listens to: an event nobody listens to costs that one look-up."""
        state, fire, on, perf_counter = self.state, self.engine.run, self.engine.active, time.perf_counter
        on_cpu, device, batch_fn, count_tokens = self._on_cpu, self.device, self.batch_fn, self.count_tokens
        optimizers, scaler, advance, step = state.optimizers, state.scaler, state.timestamp.advance, self._step
        optimizer_steps = self._optimizer_steps
        progress_schedules, batch_schedulers, shared = self._progress_schedules, self._batch_schedulers, self._share
        while True:
            if BEFORE_DATALOADER in on: fire(BEFORE_DATALOADER)                        # noqa: E701
            t0 = perf_counter()
            try:
                batch = next(batches)                                  # fetch
            except StopIteration:
                if state.timestamp.batch_in_epoch == 0:                # an epoch with no batch would repeat forever
                    raise TrainingError(empty_loader_message(state.train_dataloader, state.timestamp.epoch)) from None
                return True
            except Exception:
                if self._stop_on_signal():   # Ctrl-C reached loader workers too: the last step is saved
                    return False
                raise
            state.data_seconds += perf_counter() - t0                 # how long the step waited for its batch
            if shared is not None:                                     # data parallel: this rank's share
                batch, state.global_batch_size = shared.take(batch, state.timestamp.epoch, state.timestamp.batch_in_epoch)
            state.batch = batch if on_cpu else to_device(batch, device)
            loaded = state.batch                                       # (the compiled warm-up's source)
            if AFTER_DATALOADER in on: fire(AFTER_DATALOADER)                          # noqa: E701
            for sched in progress_schedules:                           # learning rate (and more) from progress
                sched.apply(state)
            if BATCH_START in on: fire(BATCH_START)                                    # noqa: E701
            if self._warm_pending:
                self._warm_up_compiled(loaded)                         # (compiled runs, first step only)
            batch = state.batch
            n_samples = batch[0].shape[0] if type(batch) is tuple or type(batch) is list else batch_size(batch)
            n_tokens = count_tokens(batch_fn(batch)[1])
            if shared is not None:                                     # the clock counts all ranks' samples
                n_samples, n_tokens = shared.count(n_samples, n_tokens, state.global_batch_size)
            step(state)                                                # forward, loss, reduce, backward
            if BEFORE_OPTIM_STEP in on: fire(BEFORE_OPTIM_STEP)        # noqa: E701  gradient clipping here
            if scaler is None:
                for optimizer_step in optimizer_steps:                 # (compiled with compile_optimizer)
                    optimizer_step()
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

    def _forward_backward(self, state: State) -> None:
        """The default step (algorithms may wrap it): forward, loss, reduction and backward
        of every micro-batch; `micro_batch_weight` is a micro-batch's share of the step's
        samples. Per-target losses of class or token ids are summed and divided by the step's
        counted targets (those that are not the ignore index, -100), counted over all micro-batches
        before the first backward and, under data parallelism, over all ranks (`loss_weight`).
        Under data parallelism `state.batch` is this rank's share of the global batch (taken at
        fetch), gradients are all-reduced on the last micro-batch only (what `no_sync` does), and
        a loss of another shape is weighted by the rank's share (`RankShare.rank_scale`), so that
        DDP's gradient average is the global mean either way."""
        fire, on, autocast, batch_fn = self.engine.run, self.engine.active, self._autocast_ctx, self.batch_fn
        step_loss = self._step_loss   # the default loss's mean inside the kernel when nobody reads per-sample losses
        batch, grad_sync, by_size = state.batch, self._grad_sync, state.microbatch is not None
        k = state.grad_accum if not by_size else micro_count(batch_size(batch), state.microbatch, 1)
        scale = self._share.rank_scale if self._share is not None else 1.0
        micros = (batch,) if k == 1 else split_batch(batch, k)
        total = batch_size(batch) if k > 1 or scale != 1.0 else 0
        state.loss_weight, counted_yet = None, not self._count_targets
        redoable = state.microbatch_auto and grad_sync is not None   # ranks agree after the step, then average
        if redoable and not counted_yet:   # the one collective of the step's targets, before anyone can run out
            state.loss_weight, counted_yet = self._loss_weight(micros), True
        n_losses, limit = len(state.step_losses), self._budget
        for i, micro in enumerate(micros):
            ctx = ActivationBudget(limit, autocast, batch_size(micro)) if limit else autocast   # (what it saves for backward)
            state.micro_batch, state.micro_batch_index = micro, i
            state.micro_batch_weight = batch_size(micro) / total * scale if total else scale
            if grad_sync is not None:
                grad_sync(i == k - 1 and not redoable)                 # reduce across ranks on the last only
            if BEFORE_FORWARD in on: fire(BEFORE_FORWARD)                              # noqa: E701
            inputs, targets = batch_fn(state.micro_batch)
            with ctx:
                state.outputs = forward(state.forward_model, inputs)
            if AFTER_FORWARD in on: fire(AFTER_FORWARD)                                # noqa: E701
            if BEFORE_LOSS in on: fire(BEFORE_LOSS)                                    # noqa: E701
            with ctx:
                state.loss = checked_loss(step_loss, state.outputs, targets)   # the task's loss, as algorithms wrapped it
            state.loss_count = state.loss.numel()
            if not counted_yet and state.loss.dim():   # per-element losses: count the step's targets, once,
                state.loss_weight, counted_yet = self._loss_weight(micros), True   # before the first backward
            state.loss_per_target = state.loss_weight is not None and state.loss_count == targets.numel()
            if AFTER_LOSS in on: fire(AFTER_LOSS)                      # noqa: E701  per-sample losses: reweight, drop
            state.loss = loss = self.reduce_loss(state.loss)
            state.step_losses.append(loss.detach())                    # read at log points only
            if BEFORE_BACKWARD in on: fire(BEFORE_BACKWARD)                            # noqa: E701
            (loss if state.scaler is None else state.scaler.scale(loss)).backward()
            if AFTER_BACKWARD in on: fire(AFTER_BACKWARD)                              # noqa: E701
        if by_size and len(state.step_losses) - n_losses > 1:   # one entry per step when k varies from step to step
            state.step_losses[n_losses:] = [torch.stack(state.step_losses[n_losses:]).sum()]

    def _optimizers_compiled(self) -> None:
        """Run once after the first compiled optimizer steps: graphs compiled from here on are
        counted (`compile/graphs_after_warmup`), then it takes itself off the list."""
        self._graphs_after_warmup = compiled_graphs()
        self._optimizer_steps.remove(self._optimizers_compiled)

    def _warm_up_compiled(self, loaded) -> None:
        """A compiled run, before its first step: one step on every form the batch as loaded will
        take (Algorithm.batch_variants: resized images, shorter sequences, each then passed
        through the other algorithms' AFTER_DATALOADER work; the batch itself where no algorithm
        changes its shape), the same again cut to the size of the epoch's last batch where the
        loader keeps a smaller one, each also under every other path an algorithm's step takes
        later (Algorithm.step_paths: selective backprop's scoring and partial step), and the
        evaluation-mode forwards (the plain one and those an
        algorithm adds: Algorithm.eval_forwards) on an evaluation batch and on one of the
        evaluation loader's last size, all undone (gradients, logged losses, buffers,
        random state), so that compiling them falls in the first step's warm-up, not in timed
        steps. Graphs compiled after this are counted at the end of fit
        (`compile/graphs_after_warmup`, and a warning)."""
        state = self.state
        self._warm_pending = False
        variants = [(a, v) for a in state.algorithms for v in a.batch_variants(state, loaded)]
        if not variants:   # the batch keeps its shape: the step on it (already through AFTER_DATALOADER)
            variants = [(None, None)]
        last = self._local_last_size(state.train_dataloader)
        if last is not None and 0 < last < batch_size(loaded):
            variants += [(a, cut(loaded if v is None else v, last)) for a, v in variants]
        # the step as it runs now, then under each other path an algorithm's step will take later
        paths = [contextlib.nullcontext] + [p for a in state.algorithms for p in a.step_paths(state)]
        cfg = torch._dynamo.config   # a graph per shape and grad mode (static shapes), evaluation's too, and room to spare
        cfg.recompile_limit = max(cfg.recompile_limit, len(variants) * (2 * len(paths) - 1) + 6)
        batch, snapshot, n_losses = state.batch, StepSnapshot(state.model, self.device), len(state.step_losses)
        for producer, v in variants:
            if v is not None:
                state.batch = v   # then what the other algorithms do to every batch (memory layout, mixing)
                for other in state.algorithms:
                    if other is not producer and type(other).after_dataloader is not Algorithm.after_dataloader:
                        other.after_dataloader(state, self.logger)
            prepared = state.batch   # made once, stepped on under every path
            for path in paths:
                state.batch = prepared
                with path():
                    self._step(state)
                for opt in state.optimizers:
                    opt.zero_grad(set_to_none=True)
            state.batch = batch
        if self.eval_dataloader is not None and not state.microbatch_auto:
            with torch.inference_mode(), self.runtime.autocast():   # as evaluate() runs
                state.model.eval()
                first = next(iter(self.eval_dataloader), None)
                if first is not None:
                    first = self.batch_fn(to_device(first, self.device))[0]
                    last = self._local_last_size(self.eval_dataloader)
                    for inputs in [first] + ([cut(first, last)] if last is not None and 0 < last < batch_size(first) else []):
                        forward(self._eval_model, inputs)
                        for a in state.algorithms:   # the forwards its evaluations add (test-time augmentation)
                            if type(a).eval_forwards is not Algorithm.eval_forwards:
                                a.eval_forwards(state, self._eval_model, inputs)
                state.model.train()
        del state.step_losses[n_losses:]
        snapshot.restore()
        self._graphs_after_warmup = compiled_graphs()

    def _local_last_size(self, loader) -> int | None:
        """This rank's size of the epoch's last batch of `loader` (None where unknown)."""
        last = last_batch_size(loader, self.state.timestamp.epoch)
        if last is None or self.world.size == 1:
            return last
        if own_sharing(loader) is None:
            return None   # a loader that does not share itself: the rank's size is not known here
        start, stop = share_range(last, self.world.rank, self.world.size)
        return stop - start

    def _redo_when_out_of_memory(self, step: Callable) -> Callable:
        """microbatch='auto': the step, redone with half the micro-batch whenever it runs out of
        memory, from where it started (gradients, logged losses, buffers and random state put
        back), so the run equals one that used the final size from the start. Under data
        parallelism the ranks agree whether any ran out, then retry or average together."""
        state, world = self.state, self.world
        self._warned_batch_stats = False

        def redo(state_):
            n = batch_size(state.batch)
            while True:
                snapshot, n_losses = StepSnapshot(state.model, self.device), len(state.step_losses)
                try:
                    step(state_)
                    ran_out, last = False, None
                except torch.OutOfMemoryError as e:
                    ran_out, last = True, e
                if world.size > 1:
                    flag = torch.tensor([float(ran_out)], device=self.device)
                    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
                    ran_out = bool(flag.item())
                if not ran_out:
                    if world.size > 1:
                        average_gradients(state.model, world.size)
                    return
                for opt in state.optimizers:
                    opt.zero_grad(set_to_none=True)
                del state.step_losses[n_losses:]
                state.outputs = state.loss = None
                snapshot.restore()
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                try:
                    state.microbatch = halved(state.microbatch, n)
                except torch.OutOfMemoryError:
                    if isinstance(last, ActivationLimitError):   # the limit, not the model, is what a user changes
                        raise ActivationLimitError(last.limit, last.used, last.samples, smallest=True) from None
                    raise
                self.logger.log({"trainer/microbatch": state.microbatch})
                print(f"hasten: batch {state.timestamp.batch + 1} ran out of memory; micro-batches of "
                      f"{state.microbatch} from now on", file=sys.stderr, flush=True)
                if not self._warned_batch_stats and has_batch_norm(state.model):
                    self._warned_batch_stats = True
                    warnings.warn(f"microbatch=auto: batch norm now normalises over {state.microbatch} samples, not the "
                                  f"batch of {n}: the run's arithmetic changed with the micro-batch (its loss will "
                                  "differ from a run at the whole batch); give a fixed trainer.microbatch, or a "
                                  "smaller batch, to decide it yourself")
        return redo

    def _loss_weight(self, micros) -> "torch.Tensor | None":
        """world size / the step's targets that count (not the ignore index), on the device: the
        weight of one per-target loss. None when the targets are not class or token ids. Under
        data parallelism one all-reduce of the count, which every rank joins (an empty share
        counts 0)."""
        count = None
        for micro in micros:
            targets = self.batch_fn(micro)[1]
            if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or targets.is_complex():
                return None
            c = (targets != IGNORE_INDEX).sum()
            count = c if count is None else count + c
        if count is None:
            return None
        if self._share is not None:
            torch.distributed.all_reduce(count)
        return self.world.size / count.clamp_min(1)

    def _epoch_complete(self) -> bool:
        """After a stop: the epoch is complete when its last batch was the stopping point."""
        spe = self.state.steps_per_epoch
        return not self._stop.signalled and spe is not None and self.state.timestamp.batch_in_epoch >= spe

    def reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The step's mean, this micro-batch's part of it.

        Per-target losses of class or token ids (`state.loss_per_target`): their sum times
        `state.loss_weight`, so the step's loss is the mean over the targets that count (an
        ignore-index target, -100, counts nowhere: its loss is 0 and it is not in the
        denominator). Other losses: the mean over the micro-batch's elements, weighted by its
        share of the step's samples. Either way the denominator is fixed before algorithms act:
        an algorithm that zeroes or drops samples keeps them in it; one that reweights
        (InfoBatch) scales them. A scalar loss is weighted by the micro-batch's share.
        """
        state = self.state
        if loss.dim() == 0:
            if state.micro_batch_weight == 0.0:   # an empty share: a mean over nothing is NaN; it counts nothing
                return torch.where(torch.isfinite(loss), loss, torch.zeros_like(loss)) * 0.0
            return loss * state.micro_batch_weight if state.micro_batch_weight != 1.0 else loss
        if state.loss_per_target:
            return loss.sum() * state.loss_weight
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
            return self._stop.pending and self._stop_on_signal() or state.stop_training
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
        """True (after saving a checkpoint) when SIGTERM or a first Ctrl-C arrived; under data
        parallelism every rank stops at the same step (hasten.distributed.stop)."""
        if not self._stop.should_stop():
            return False
        if not self.state.stop_training:
            self._save_on_signal()
        return True

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
        if self._has_eval() and self._evaluated_at != state.timestamp.batch and not self._stop.signalled:
            self._evaluate_during_fit()
        self.engine.run(FIT_END)
        self.logger.flush(state.timestamp.batch)

    def _log_train(self) -> None:
        state = self.state
        if self.world.size > 1:   # every rank joins, whatever its share held (each holds its weighted share)
            loss = state.read_train_loss(check=False)
            total, ranks = all_sum(self.device, 0.0 if loss is None else loss, 0.0 if loss is None else 1.0)
            loss = state.check_train_loss(total / self.world.size) if ranks else None
        else:
            loss = state.read_train_loss()
        if loss is not None:
            trained = state.timestamp.train_seconds - self._logged_at[1]
            wait = (state.data_seconds - self._logged_at[0]) / trained if trained > 0 else 0.0
            self._logged_at = (state.data_seconds, state.timestamp.train_seconds)
            self.logger.log({"train/loss": loss, "train/lr": state.lr(), "train/epoch": state.timestamp.epoch,
                             "time/train_seconds": state.timestamp.train_seconds, "time/data_wait": wait})
        self.logger.flush(state.timestamp.batch)

    def _has_eval(self) -> bool:
        return self.eval_dataloader is not None

    def _evaluate_during_fit(self) -> None:
        self.evaluate()
        self._evaluated_at = self.state.timestamp.batch

    def _save_on_signal(self) -> None:
        state, what = self.state, f"{self._stop.what} received"
        state.stop_training, state.stop_reason = True, self._stop.reason or "sigterm"
        if state.stop_reason == "logger":
            what = f"{self.logger.failure}; trainer.on_logger_error is stop"
        if not (self.world.is_main or self.world.sharded):   # a sharded model is gathered by every rank
            return
        if self.checkpointer is None:
            if self.world.is_main:
                warnings.warn(f"{what}: training stopped; no save_folder, so no checkpoint was written")
            return
        path = self.checkpointer.save(state)
        if self.world.is_main:
            print(f"{what}: checkpoint written to {path}" + (f"; {self.resume_hint}" if self.resume_hint else ""),
                  flush=True)

    # ------------------------------------------------------------------ evaluate / predict
    @torch.inference_mode()
    def evaluate(self, dataloader: Iterable | None = None, prefix: str = "val") -> dict[str, float]:
        """Mean loss over all samples (or the tokens that count) and the metrics, under inference
        mode; logged, and seen by algorithms and callbacks."""
        check_loader("evaluate", dataloader)
        return self._evaluate(dataloader, prefix, record=True)

    @torch.inference_mode()
    def _evaluate_for_algorithms(self) -> dict[str, float]:
        """`state.evaluate`: the model as it is now on the evaluation data, seen by algorithms
        only (their evaluation events run: test-time augmentation counts), not logged."""
        return self._evaluate(None, "val", record=False)

    def _evaluate(self, dataloader, prefix: str, record: bool) -> dict[str, float]:
        state, run = self.state, (self.engine.run if record else self.engine.run_algorithms)
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
        count, world = torch.zeros((), device=self.device, dtype=torch.int64), self.world
        shared = RankShare(dataloader, world, "evaluation") if world.size > 1 else None
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
            pieces = [batch]   # microbatch='auto': split into what fits, once evaluation ran out of memory
            while pieces:
                piece = pieces.pop(0)
                n = batch_size(piece)
                if self._eval_micro is not None and n > self._eval_micro:
                    pieces[:0] = split_batch(piece, micro_count(n, self._eval_micro, 1))
                    continue
                try:
                    piece_loss, piece_count = self._evaluate_batch(piece, metrics, run)
                except torch.OutOfMemoryError:
                    if not state.microbatch_auto or world.sharded:   # (sharded: every rank must run the same forwards)
                        raise
                    self._eval_micro = halved(n, n)
                    print(f"hasten: evaluation ran out of memory; batches of {self._eval_micro} from now on",
                          file=sys.stderr, flush=True)
                    pieces.insert(0, piece)   # split above, now that it is larger than the size that fits
                    continue
                loss_sum += piece_loss
                count += piece_count
        results = {}
        total_loss, count = float(loss_sum), int(count)
        if world.size > 1:   # metrics synchronise themselves in compute() (torchmetrics)
            total_loss, count = all_sum(self.device, total_loss, float(count))
        if count:
            results[f"{prefix}/loss"] = total_loss / count
        for name, m in metrics.items():
            results[f"{prefix}/{name}"] = float(m.compute())
        if record:
            state.eval_metrics = results
            # when, in training time, this evaluation happened (quality against time from the log
            # alone); its own key, since the training record of the same step has time/train_seconds
            self.logger.log({**results, "time/train_seconds_at_eval": state.timestamp.train_seconds})
        run(EVAL_END)
        state.forward_model = train_forward
        if record:
            self.logger.flush(state.timestamp.batch)
            results = state.eval_metrics   # an algorithm may have kept other weights at EVAL_END, with their results
        if was_training:
            state.model.train()
        return results

    def _evaluate_batch(self, batch, metrics: dict, run) -> tuple:
        """One evaluation batch: forward, loss, metrics; returns (loss sum, counted targets). A
        batch that runs out of memory before its metrics are updated has changed nothing, so
        microbatch='auto' can split it and evaluate the halves."""
        state = self.state
        state.batch = batch
        run(EVAL_BATCH_START)
        inputs, targets = self.batch_fn(state.batch)
        loss_sum, count = 0.0, 0
        with self.runtime.autocast():
            outputs = forward(state.forward_model, inputs)
            state.outputs = outputs
            if targets is not None:
                loss = checked_loss(state.loss_fn, outputs, targets)
                loss_sum, count = loss.double().sum(), counted(loss, targets)
        if targets is not None and metrics:
            logits = logits_of(outputs)
            for m in metrics.values():
                m.update(logits.float() if logits.is_floating_point() else logits, targets)
        run(EVAL_BATCH_END)
        return loss_sum, count

    @torch.inference_mode()
    def predict(self, dataloader: Iterable) -> list:
        """Model outputs for every batch (on the CPU), in order."""
        check_loader("predict", dataloader)
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


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (dynamo's own counter)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def fit_summary(state: State, wall_s: float) -> str:
    """The line fit() ends with: what was trained, in how long, and the final evaluation."""
    ts = state.timestamp
    line = (f"hasten: trained {ts.batch} batches ({ts.sample:,} samples"
            + (f", {ts.token:,} tokens" if ts.token else "") + f") in {ts.train_seconds:.1f} s of training, "
            f"{wall_s:.1f} s in all")
    if ts.train_seconds > state.fit_train_seconds:
        line += f" (waiting for data {100 * state.data_wait:.0f}% of the training time)"
    if state.stop_reason:
        line += f"; stopped: {state.stop_reason}"
    if state.eval_metrics:
        line += "; " + "  ".join(f"{k}={v:.4g}" for k, v in state.eval_metrics.items())
    return line


def empty_loader_message(loader, epoch: int) -> str:
    """What to say when the training loader yields no batch in an epoch."""
    dataset = getattr(loader, "dataset", None)
    what = type(loader).__name__
    if dataset is not None and hasattr(dataset, "__len__"):
        what += (f" over {len(dataset)} samples, batch_size {getattr(loader, 'batch_size', '?')}, "
                 f"drop_last {getattr(loader, 'drop_last', '?')}")
    return (f"the training loader ({what}) yields no batch in epoch {epoch}: its data is empty, or smaller than one "
            "batch with drop_last=True; give it more data, a smaller batch size or drop_last=False")


def counted(loss: torch.Tensor, targets) -> "torch.Tensor | int":
    """How many of a batch's losses count in a mean: for per-target losses of class or token
    ids, the targets that are not the ignore index; otherwise every element (a scalar: one)."""
    if (loss.dim() and isinstance(targets, torch.Tensor) and loss.numel() == targets.numel()
            and not targets.is_floating_point() and not targets.is_complex()):
        return (targets != IGNORE_INDEX).sum()
    return loss.numel()
