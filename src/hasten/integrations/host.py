"""hasten Algorithms inside another trainer's loop (Lightning, the Hugging Face Trainer).

A host loop gives hasten's algorithms some of the places hasten's own Trainer gives them:
`HostLoop` keeps a hasten `State` that mirrors the host (the module, its optimizers, the
steps taken and to take, the batch), runs the events the host has a place for through
hasten's own Engine, and builds the training loss through the algorithms' loss seam.

What a host offers (both hosts here):
- INIT, before the host builds its optimizers: model surgery;
- FIT_START, EPOCH_START/END, FIT_END;
- AFTER_DATALOADER and BATCH_START with the batch (methods that change it: resizing, MixUp,
  CutOut, warm-ups of the batch or the sequence length);
- BEFORE_OPTIM_STEP, AFTER_OPTIM_STEP and BATCH_END around each optimizer step (clipping,
  EMA, SWA, Lookahead, layer freezing, gradual pruning);
- EVAL_START/EVAL_END around each evaluation (EMA and SWA evaluate their average);
- the loss seam, where the host's loss goes through hasten (label smoothing, MixUp's mixed
  targets): `training_loss(base)`.

What no host offers, and so is refused at set-up with the reason (`refusals`): the step
seam (SAM, selective backprop, proxy selection run their own forward and backward passes),
the per-sample losses before reduction (InfoBatch), the per-micro-batch events, the
evaluation forward (TTA), the training data at set-up (patch whitening fits on it), and a
loss that never forms logits (chunked cross-entropy).

Beside the algorithms, a host loop can set one of hasten's systems settings the host does not
have: the host allocator (`host_allocator="auto"` tunes glibc malloc for CPU training, as
`hasten train` does; see hasten.allocator). It is process-wide, so it is asked for, never the
default.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch

from .. import algorithms
from ..allocator import MODES as ALLOCATOR_MODES, configure_host_allocator
from ..arguments import listed
from ..core import Algorithm, Engine, Event, State, Time
from ..data.batches import batch_size, inputs_targets
from ..loggers.base import LogHub
from ..loss import IGNORE_INDEX, default_loss, logits_of
from ..registry import ALGORITHMS
from ..runtime import Runtime

# the events a host loop fires (see the module doc)
HOST_EVENTS = frozenset({Event.INIT, Event.FIT_START, Event.EPOCH_START, Event.AFTER_DATALOADER, Event.BATCH_START,
                         Event.BEFORE_OPTIM_STEP, Event.AFTER_OPTIM_STEP, Event.BATCH_END, Event.EVAL_START,
                         Event.EVAL_END, Event.EPOCH_END, Event.FIT_END})

# why an algorithm cannot run in another trainer's loop, and what to use instead
WHY_NOT = {
    "tta": "it replaces the forward pass hasten's evaluation calls, and the host's evaluation calls the module "
           "itself; call hasten.functional.tta_logits in your validation step instead",
    "patch_whitening": "it fits the first convolution on training images before the optimizer exists, and the host "
                       "loads its data later; fit it yourself with hasten.functional.fit_patch_whitening before "
                       "training",
    "chunked_cross_entropy": "it changes what the model returns (hidden states) and computes the loss without "
                             "logits, and the host computes its own loss from logits; use it in hasten's Trainer",
    "infobatch": "it reweights per-sample losses and steers the sampler, and the host reduces the loss and owns "
                 "its sampler; use hasten.functional.InfoBatchPruner in a plain loop, or hasten's Trainer",
}


def refusal(algorithm: Algorithm, host: str) -> str | None:
    """Why `algorithm` cannot run inside `host`'s loop, or None when it can."""
    name = getattr(algorithm, "registry_name", type(algorithm).__name__)
    if name in WHY_NOT:
        return WHY_NOT[name]
    if type(algorithm).wrap_step is not Algorithm.wrap_step:
        return (f"it runs its own forward and backward passes (the step seam), which {host}'s training step does "
                "not let a plugin replace; use it in hasten's Trainer")
    missing = [e.value for e in type(algorithm).listens_to() if e not in HOST_EVENTS]
    if missing:
        return f"it acts at {', '.join(missing)}, which {host}'s loop gives no place to"
    return None


def refusals_message(algorithms: Sequence[Algorithm], host: str) -> str | None:
    """One message naming every algorithm that cannot run in `host`'s loop, or None."""
    why = [(a, refusal(a, host)) for a in algorithms]
    bad = [f"{getattr(a, 'registry_name', a.name)}: {r}" for a, r in why if r]
    return f"cannot run in {host}: " + "; ".join(bad) if bad else None


class HostLoop:
    """A hasten State and Engine driven by another trainer's hooks. The host adapter calls
    the methods below from its own hooks, in its loop's order."""

    def __init__(self, algorithms: Sequence[Algorithm], host: str, seed: int = 0, host_allocator: str = "default"):
        if host_allocator not in ALLOCATOR_MODES:
            raise ValueError(f"{host}: host_allocator={host_allocator!r} is not a mode: use one of "
                             f"{', '.join(ALLOCATOR_MODES)} ('auto' tunes glibc malloc when training on a CPU)")
        try:
            algorithms = listed("algorithms", algorithms)
        except TypeError as e:
            raise TypeError(f"{host}: {e}") from None
        refused = refusals_message(algorithms, host)
        if refused:
            raise ValueError(refused)
        self.host, self.seed, self.host_allocator = host, seed, host_allocator
        self.algorithms = list(algorithms)
        self.state: State | None = None
        self.engine: Engine | None = None
        self.logger = LogHub()
        self._t_step = None

    # ------------------------------------------------------------------ set-up
    def setup(self, model: torch.nn.Module, device: "torch.device | str" = "cpu", precision: str = "fp32",
              evaluate: Callable[[], dict] | None = None, quality: tuple = ("val/loss", "min")) -> None:
        """Before the host builds its optimizers: tune the host allocator if asked, make the
        State and fire INIT (model surgery)."""
        configure_host_allocator(self.host_allocator, torch.device(device).type)
        runtime = Runtime.of(device=torch.device(device), precision=precision, seed=self.seed)
        self.state = State(model=model, max_duration=Time(1, "ba"), runtime=runtime, algorithms=self.algorithms,
                           batch_fn=inputs_targets, autocast=runtime.autocast, evaluate=evaluate, quality=quality)
        self.state.forward_model, self.state.host = model, self.host
        self.engine = Engine(self.state, self.logger)
        self.engine.run(Event.INIT)

    def fit_start(self, total_steps: int, steps_per_epoch: int | None, optimizers: list,
                  train_dataloader: Any = None) -> None:
        """The host knows its length and has built its optimizers."""
        s = self.state
        s.max_duration = Time(max(int(total_steps), 1), "ba")
        s.steps_per_epoch = steps_per_epoch
        s.optimizers = list(optimizers)
        s.train_dataloader = train_dataloader
        self.engine.run(Event.FIT_START)

    def training_loss(self, base: Callable = default_loss) -> Callable:
        """The training loss: `base(outputs, targets)` wrapped by every algorithm's loss seam,
        first algorithm innermost (as hasten's Trainer builds it); evaluation keeps `base`."""
        loss = base
        for a in self.algorithms:
            loss = a.wrap_loss(loss)
        self.state.loss_fn, self.state.train_loss_fn = base, loss
        return loss

    # ------------------------------------------------------------------ per step
    def epoch_start(self) -> None:
        ts = self.state.timestamp
        ts.batch_in_epoch = ts.sample_in_epoch = ts.token_in_epoch = 0
        self.engine.run(Event.EPOCH_START)

    def batch(self, batch):
        """AFTER_DATALOADER and BATCH_START on `batch`; returns the batch as the algorithms left it."""
        self._t_step = time.perf_counter()
        self.state.batch = batch
        self.engine.run(Event.AFTER_DATALOADER)
        self.engine.run(Event.BATCH_START)
        return self.state.batch

    def before_optim_step(self) -> None:
        self.engine.run(Event.BEFORE_OPTIM_STEP)

    def after_step(self, samples: int | None = None, tokens: int = 0) -> None:
        """One optimizer step is done: AFTER_OPTIM_STEP, the clock, BATCH_END."""
        s = self.state
        self.engine.run(Event.AFTER_OPTIM_STEP)
        n = samples if samples is not None else (batch_size(s.batch) if s.batch is not None else 0)
        dt = time.perf_counter() - self._t_step if self._t_step is not None else 0.0
        s.timestamp.advance(n, tokens, dt)
        self.engine.run(Event.BATCH_END)
        self.logger.flush(s.timestamp.batch)

    def epoch_end(self) -> None:
        self.state.timestamp.epoch += 1
        self.engine.run(Event.EPOCH_END)

    # ------------------------------------------------------------------ evaluation and the end
    def eval_start(self) -> None:
        self.engine.run(Event.EVAL_START)

    def eval_end(self, metrics: dict | None = None) -> None:
        if metrics:
            self.state.eval_metrics = dict(metrics)
        self.engine.run(Event.EVAL_END)

    def fit_end(self) -> None:
        self.engine.run(Event.FIT_END)

    def state_dict(self) -> dict:
        """The algorithms' own state (EMA weights, ...) and the clock, for the host's checkpoints."""
        return {"timestamp": self.state.timestamp.state_dict(),
                "algorithms": [a.state_dict() for a in self.algorithms]}

    def load_state_dict(self, d: dict) -> None:
        self.state.timestamp.load_state_dict(d["timestamp"])
        for a, sd in zip(self.algorithms, d["algorithms"]):
            a.load_state_dict(sd)


def support_table() -> str:
    """The markdown table of docs/integrations.md: every registered method in each host (hasten's
    Trainer, Lightning, the HF Trainer, a plain loop), generated from the refusal rules above
    so that it cannot drift from the code (`python -m hasten.integrations.host` prints it)."""
    modules = {m.__name__.rsplit(".", 1)[-1]: m for m in algorithms.MODULES}
    lines = ["| method | hasten Trainer | Lightning (`HastenCallback`) | HF Trainer (`HastenTrainer`) | plain loop (`hasten.functional`) |",
             "|---|---|---|---|---|"]
    needs = {"proxy_selection": {"proxy": torch.nn.Linear(1, 1)}}
    extra_forms = {"cutout": ["cutout"]}   # forms that live with the data augmentations
    for name, cls in sorted(ALGORITHMS.items()):
        if name in algorithms.INSTRUMENTS:
            continue
        why = refusal(cls(**needs.get(name, {})), "the host")
        loss = why is None and cls.wrap_loss is not Algorithm.wrap_loss
        batch = why is None and Event.AFTER_DATALOADER in cls.listens_to()
        lightning = ("yes" + (" (through the module's `loss_fn`)" if loss else "")
                     + (" (a list or dict batch)" if batch else "")) if why is None else f"no: {why}"
        hf = ("yes" + (" (the loss from the model's logits)" if loss else "")) if why is None else "no: as Lightning"
        forms = sorted(algorithms.functional_forms(modules[name])) + extra_forms.get(name, [])
        lines.append(f"| [{name}](methods/{name}.md) | yes | {lightning} | {hf} | "
                     f"{', '.join(f'`{f}`' for f in forms) or '-'} |")
    return "\n".join(lines) + "\n"


def mean_over_targets(losses: torch.Tensor, targets: Any, num_items: Any = None) -> torch.Tensor:
    """A per-sample (or per-token) loss reduced as hasten's Trainer reduces it: the sum over the
    targets that count (not the ignore index) divided by their number, or by `num_items` (the
    Hugging Face Trainer's count over the accumulated micro-batches) when given."""
    if losses.dim() == 0:
        return losses
    if num_items is not None:
        return losses.sum() / num_items
    y = targets[0] if isinstance(targets, (tuple, list)) else targets
    if isinstance(y, torch.Tensor) and y.dtype == torch.long and y.numel() == losses.numel():
        return losses.sum() / (y != IGNORE_INDEX).sum().clamp(min=1)
    return losses.mean()


__all__ = ["HOST_EVENTS", "HostLoop", "WHY_NOT", "logits_of", "mean_over_targets", "refusal", "refusals_message",
           "support_table"]

if __name__ == "__main__":
    print(support_table(), end="")
