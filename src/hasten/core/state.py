"""State: everything algorithms read and change, in one object."""
from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from typing import Any, Callable

import torch

from ..errors import HastenError
from ..runtime import Runtime
from .time import Time, Timestamp, TimeUnit

_ONE_BATCH = Time(1, "ba")


@dataclass(eq=False)
class State:
    """What algorithms read and change. Where and how the run computes is `runtime` (device,
    precision, seed, world), held once: `state.device`, `.precision` and `.seed` read it. A
    State built by hand (a test of an algorithm) may give `device=`, `precision=`, `seed=`
    instead of a runtime."""
    model: torch.nn.Module
    max_duration: Time
    runtime: Runtime | None = None   # hasten.Runtime: device, precision, seed, threads, allocator, world
    optimizers: list = field(default_factory=list)
    schedulers: list = field(default_factory=list)
    loss_fn: Callable | None = None      # the task's loss: evaluation uses it as it is
    train_loss_fn: Callable | None = None   # the task's loss wrapped by the algorithms (Algorithm.wrap_loss), set by fit
    train_dataloader: Any = None
    eval_dataloader: Any = None
    algorithms: list = field(default_factory=list)
    callbacks: list = field(default_factory=list)
    timestamp: Timestamp = field(default_factory=Timestamp)
    grad_accum: int = 1
    microbatch: int | None = None # samples per micro-batch when the Trainer splits by size (microbatch=N, or
                                  # the size microbatch='auto' found to fit); None: grad_accum parts
    microbatch_auto: bool = False # microbatch='auto': halve on out-of-memory; a resume starts from the saved size
    scaler: Any = None            # torch.amp.GradScaler for fp16-mixed
    forward_model: Any = None     # what the forward pass calls: the model, or its compiled form
    host: str | None = None       # the trainer whose own loop drives hasten's events (Lightning, the HF
                                  # Trainer), which may compile or wrap the model unseen; None: hasten's Trainer
    batch_fn: Callable | None = None   # batch -> (inputs, targets): the Trainer's batch contract
    autocast: Callable | None = None   # () -> the precision's autocast context, for extra forward passes
    evaluate: Callable | None = None   # () -> metrics of the model as it is now, seen by algorithms only (not
                                       # logged, no callbacks); None without an evaluation set
    quality: tuple = ("val/loss", "min")   # the metric that judges the run and which way is better
    # per step
    batch: Any = None             # the batch of the step, on the device (under data parallelism: this rank's share)
    global_batch_size: int = 0    # under data parallelism: the step's samples on all ranks together (an
                                  # algorithm that changes how many samples the step trains on sets it)
    micro_batch: Any = None       # the micro-batch being processed (== batch when grad_accum == 1)
    micro_batch_index: int = 0
    micro_batch_weight: float = 1.0  # share of the step's samples in this micro-batch
    outputs: Any = None
    loss: Any = None              # per-sample losses after the loss event, the scalar after reduction
    loss_count: int = 1           # elements the per-sample loss had before algorithms touched it
    loss_weight: Any = None       # world size / the step's counted targets (a device tensor); None: not ids
    loss_per_target: bool = False # this micro-batch's loss has one element per target: reduced with loss_weight
    grads_unscaled_at: int = -1   # fp16-mixed: the batch whose gradients the scaler has unscaled already
    # eval
    eval_metrics: dict = field(default_factory=dict)   # last evaluation results, name -> float
    # training loss, accumulated on the device and read only at log and save points
    step_losses: list = field(default_factory=list)  # detached reduced losses since the last read
    checked_batch: int = 0        # batches up to here are known to have had finite losses
    last_checkpoint: str | None = None
    resumed_from: dict | None = None   # {"path", "run_id"} of the checkpoint this state was restored from
    loader_restored: bool = False      # the training loader's own state came back from the checkpoint
    data_seconds: float = 0.0          # this fit's time spent getting the next training batch (in train_seconds)
    fit_train_seconds: float = 0.0     # timestamp.train_seconds when this fit started

    @property
    def data_wait(self) -> float:
        """The share of this fit's training time spent waiting for the next batch: near 0 when
        the model is the bottleneck, near 1 when the loader is."""
        trained = self.timestamp.train_seconds - self.fit_train_seconds
        return self.data_seconds / trained if trained > 0 else 0.0
    method_seconds: float = 0.0   # time algorithms spent on work that is part of their method outside the
                                  # training clock (a whitening fit, test-time views); the harness reports it
    # control
    log_due: bool = False         # this batch end is a log point: callbacks may read tensors now
    at_epoch_end: bool = False
    steps_per_epoch: int | None = None
    stop_training: bool = False
    stop_reason: str | None = None
    extra: dict = field(default_factory=dict)  # room for users' own algorithms to share data (hasten's use none)
    compile_graphs_after_warmup: int | None = None   # compiled runs: graphs compiled inside timed training
    optimizer_compiled: bool = False   # the optimizers' steps run compiled (trainer.compile_optimizer): the set
                                       # of parameters with gradients must not change part-way
    device: InitVar[Any] = None        # instead of runtime: a State built by hand
    precision: InitVar[str | None] = None
    seed: InitVar[int | None] = None

    def __post_init__(self, device, precision, seed):
        asked = {k: v for k, v in (("device", device), ("precision", precision), ("seed", seed)) if v is not None}
        if self.runtime is None:
            self.runtime = Runtime.of(**asked)
        elif asked:
            raise ValueError(f"give runtime= or {', '.join(asked)}, not both")

    # ------------------------------------------------------------------ progress
    @property
    def progress(self) -> float:
        """Fraction of max_duration done, in [0, 1]."""
        ts, unit, total = self.timestamp, self.max_duration.unit, self.max_duration.value
        if unit == TimeUnit.EPOCH:
            done = ts.epoch
            if self.steps_per_epoch:
                done += min(ts.batch_in_epoch / self.steps_per_epoch, 1.0)
        elif unit == TimeUnit.DURATION:
            raise ValueError("max_duration cannot be given in 'dur'")
        else:
            done = ts.get(unit)
        return min(done / total, 1.0) if total else 1.0

    def fraction_of(self, t: "Time | str") -> float:
        """Express a typed time as a fraction of max_duration."""
        t = Time.parse(t)
        if t.unit == TimeUnit.DURATION:
            return float(t.value)
        unit, total = self.max_duration.unit, self.max_duration.value
        if t.unit == unit:
            return t.value / total
        if {t.unit, unit} == {TimeUnit.EPOCH, TimeUnit.BATCH}:
            if not self.steps_per_epoch:
                raise ValueError(f"cannot convert {t} into a fraction of {self.max_duration}: "
                                 "the training dataloader has no length")
            if t.unit == TimeUnit.EPOCH:
                return t.value * self.steps_per_epoch / total
            return t.value / (total * self.steps_per_epoch)
        raise ValueError(f"cannot convert {t} into a fraction of max_duration={self.max_duration}; "
                         f"state it in {unit.value} or as a fraction ('0.1dur')")

    def batch_fraction(self) -> float:
        """One batch as a fraction of max_duration (0.0 where it cannot be stated, e.g. an
        epoch-long run over a loader without a length)."""
        try:
            return self.fraction_of(_ONE_BATCH)
        except ValueError:
            return 0.0

    def progress_through(self, t: "Time | str") -> float:
        """How far through the first `t` of the run training is: 0 at the start, 1 at `t`
        and after (warm-ups use it)."""
        frac = self.fraction_of(t)
        return min(self.progress / frac, 1.0) if frac > 0 else 1.0

    def is_done(self) -> bool:
        ts, unit, total = self.timestamp, self.max_duration.unit, self.max_duration.value
        if unit == TimeUnit.EPOCH:
            return ts.epoch >= total
        return ts.get(unit) >= total

    # ------------------------------------------------------------------ loss checks
    def read_train_loss(self, reset: bool = True, check: bool = True) -> float | None:
        """Mean training loss since the last reset; raises NonFiniteLossError on NaN/Inf
        (with `check`; under data parallelism the Trainer checks after summing over the ranks,
        so that every rank raises, and none is left waiting in the sum).

        This is the one place the training loss crosses to the host: the trainer calls it
        at log points, and checkpointing calls it (reset=False) before writing, never every
        step. A NaN or Inf anywhere in the accumulated steps makes the sum non-finite.
        """
        if not self.step_losses:
            return None
        value = float(torch.stack(self.step_losses).double().sum()) / self.loss_steps_per_read()
        if check:
            self.check_train_loss(value)
        if reset:
            self.step_losses.clear()
        return value

    def check_train_loss(self, value: float) -> float:
        """`value`, once known finite (the batches up to now are then checked); else NonFiniteLossError."""
        if value != value or value in (float("inf"), float("-inf")):
            raise NonFiniteLossError(self.checked_batch + 1, self.timestamp.batch, self.last_checkpoint)
        self.checked_batch = self.timestamp.batch
        return value

    def loss_steps_per_read(self) -> int:
        """Number of optimizer steps in step_losses (micro-batch losses are already weighted; a
        step split by micro-batch size keeps one entry, its micro-batches' sum)."""
        return max(1, len(self.step_losses) // (1 if self.microbatch is not None else self.grad_accum))

    @property
    def optimizer(self):
        return self.optimizers[0] if self.optimizers else None

    def lr(self) -> float:
        lr = self.optimizers[0].param_groups[0]["lr"] if self.optimizers else float("nan")
        return float(lr.item()) if isinstance(lr, torch.Tensor) else lr


class NonFiniteLossError(HastenError, RuntimeError):
    """The training loss became NaN or Inf."""

    def __init__(self, first_batch: int, last_batch: int, last_checkpoint: str | None):
        where = (f"at batch {last_batch}" if first_batch >= last_batch
                 else f"between batches {first_batch} and {last_batch}")
        ckpt = (f"The last good checkpoint is {last_checkpoint}." if last_checkpoint
                else "No checkpoint was written before it.")
        super().__init__(
            f"the training loss became NaN or Inf {where}. {ckpt} Lower the learning rate, "
            "enable gradient clipping (grad_clip_norm), or use bf16-mixed instead of fp16-mixed; "
            "log more often (log_interval) to narrow down the step.")
        self.first_batch, self.last_batch, self.last_checkpoint = first_batch, last_batch, last_checkpoint


# where and how the run computes: read from the one runtime (set after the dataclass is made, so
# that `device=`, `precision=` and `seed=` stay constructor arguments of a State built by hand)
State.device = property(lambda self: self.runtime.device, doc="The run's device (runtime.device).")
State.precision = property(lambda self: self.runtime.precision, doc="The run's precision (runtime.precision).")
State.seed = property(lambda self: self.runtime.seed, doc="The run's seed (runtime.seed).")
