"""Algorithm: a two-way callback that may change the training state, one method per event."""
from __future__ import annotations

from typing import Callable

from .callback import _noop
from .event import Event


class Algorithm:
    """Subclass and override the methods of the events you act on, as with a Callback::

        class Halve(Algorithm):
            def after_dataloader(self, state, logger):
                state.batch = (state.batch[0][: len(state.batch[0]) // 2], state.batch[1][: len(state.batch[1]) // 2])

    The events an algorithm listens to are the methods its class overrides (`listens_to`);
    the Engine never calls an algorithm at any other event, so unused events cost nothing,
    and an algorithm that acts only through `wrap_step` or `wrap_loss` is never called.
    `match(event, state)` may add a condition (checked before each call when overridden).
    Algorithms that keep state across steps (EMA weights, per-sample scores) return it
    from `state_dict` so checkpoints and resumption carry it.
    """

    @property
    def name(self) -> str:
        return type(self).__name__

    @classmethod
    def listens_to(cls) -> tuple[Event, ...]:
        """The events whose method this class overrides, in firing order."""
        return tuple(e for e in Event if getattr(cls, e.value, _noop) is not _noop)

    def match(self, event: Event, state) -> bool:
        """A condition on an event this algorithm listens to; True unless overridden."""
        return True

    def wrap_step(self, step: Callable) -> Callable:
        """The step seam: return a function that replaces or wraps `step(state)`.

        `step(state)` runs the forward and backward passes of one optimizer step (all
        micro-batches). Two-pass methods (SAM, selective backprop) wrap it. The default
        leaves it as it is.
        """
        return step

    def wrap_loss(self, loss_fn: Callable) -> Callable:
        """The loss seam: return a training loss built on `loss_fn(outputs, targets)`.

        The Trainer builds the training loss once per fit, wrapping the task's loss with
        every algorithm in order (the first algorithm's wrapper innermost); evaluation
        always uses the task's own loss (`state.loss_fn`). Methods that change the targets
        or the loss (label smoothing, MixUp, CutMix) wrap it; wrappers that are linear in
        the inner loss compose in either order. The default leaves it as it is.
        """
        return loss_fn

    def batch_variants(self, state, batch) -> list:
        """Every form `batch` (as the loader gave it, before AFTER_DATALOADER) will take during
        the run because of this algorithm (smaller images, shorter sequences), the unchanged
        one included when the run reaches it. A compiled run computes one step on each before
        its clock starts, so that compiling them is not timed (the step is undone); the
        default: none (the batch keeps its shape)."""
        return []

    def step_paths(self, state) -> list:
        """Context managers, each of which makes this algorithm take, for the steps inside it, a
        path through the training step that it takes later in the run and that computes on
        other shapes or in another grad mode (selective backprop's scoring pass without
        gradients and its step on part of the batch). A compiled run's warm-up makes one step
        on every batch form under each, so that those graphs compile before its clock starts
        (the steps are undone); the default: none (the step keeps one path)."""
        return []

    def eval_forwards(self, state, model, inputs) -> None:
        """The forward passes of `model` that this algorithm's evaluations will make of the
        evaluation inputs `inputs` beyond the plain one (test-time augmentation's views of a
        subset). A compiled run makes them in its warm-up, under inference mode, so that their
        shapes compile before its clock starts; the default: none."""

    def ddp_refusal(self) -> str | None:
        """Why this algorithm (with these arguments) cannot run under data parallelism yet, or
        None when it can. The Trainer refuses it at start, with the reason, under DDP."""
        return None

    def fsdp_refusal(self) -> str | None:
        """Why this algorithm cannot run with a sharded model (parallelism 'fsdp'), or None when
        it can. The default: what `ddp_refusal` says."""
        return self.ddp_refusal()

    def ddp_options(self) -> dict:
        """Keyword arguments this algorithm needs DistributedDataParallel built with, e.g.
        `{"find_unused_parameters": True}` for one that freezes parameters part-way through the
        run (DDP otherwise waits for their gradients forever). The default asks for nothing."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass

    def __repr__(self) -> str:
        return f"{self.name}()"


def parallel_refusal_message(algorithms, parallelism: str = "ddp") -> str | None:
    """One message naming every algorithm that cannot run under `parallelism` ('ddp' or
    'fsdp'), with its reason; None when all can (the Trainer refuses at start with it;
    `hasten train --nproc` before launching)."""
    why = (lambda a: a.fsdp_refusal()) if parallelism == "fsdp" else (lambda a: a.ddp_refusal())
    refused = [f"{a.name}: {why(a)}" for a in algorithms if why(a)]
    what = "with a sharded model (fsdp)" if parallelism == "fsdp" else "data-parallel"
    return f"cannot train {what} with " + "; ".join(refused) if refused else None


for _event in Event:
    setattr(Algorithm, _event.value, _noop)
del _event
