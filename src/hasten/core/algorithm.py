"""Algorithm: a two-way callback that may change the training state."""
from __future__ import annotations

from typing import Callable, ClassVar, Iterable

from .event import Event


class Algorithm:
    """Subclass and implement `apply`; say when with `events` or by overriding `match`.

    `events` (a class or instance attribute) lists the events the algorithm listens to;
    the Engine never asks an algorithm about other events, so unused events cost nothing;
    an algorithm with no events (one that acts only through `wrap_step` or `wrap_loss`) is
    never called.
    Algorithms that keep state across steps (EMA weights, per-sample scores) return it
    from `state_dict` so checkpoints and resumption carry it.
    """

    events: ClassVar[Iterable[Event]] = ()

    @property
    def name(self) -> str:
        return type(self).__name__

    def match(self, event: Event, state) -> bool:
        return True

    def apply(self, event: Event, state, logger) -> None:
        raise NotImplementedError(f"{type(self).__name__} lists events but does not implement apply")

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

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass

    def __repr__(self) -> str:
        return f"{self.name}()"
