"""Algorithm: a two-way callback that may change the training state."""
from __future__ import annotations

from typing import Callable, ClassVar, Iterable

from .event import Event


class Algorithm:
    """Subclass and implement `apply`; say when with `events` or by overriding `match`.

    `events` (a class or instance attribute) lists the events the algorithm listens to;
    the Engine never asks an algorithm about other events, so unused events cost nothing.
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
        raise NotImplementedError

    def wrap_step(self, step: Callable) -> Callable:
        """The step seam: return a function that replaces or wraps `step(state)`.

        `step(state)` runs the forward and backward passes of one optimizer step (all
        micro-batches). Two-pass methods (SAM, selective backprop) wrap it. The default
        leaves it as it is.
        """
        return step

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass

    def __repr__(self) -> str:
        return f"{self.name}()"
