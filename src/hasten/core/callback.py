"""Callback: observes training, one method per event. Override only what you need."""
from __future__ import annotations

from .event import Event


class Callback:
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass


def _noop(self, state, logger) -> None:
    pass


for _event in Event:
    setattr(Callback, _event.value, _noop)
del _event
