"""hasten: make PyTorch training fast, and prove it.

    from hasten import Trainer, Algorithm, Callback, Event, Time
"""
from .version import __version__
from .core import Algorithm, Callback, Engine, Event, Interval, NonFiniteLossError, State, Time, Timestamp, TimeUnit
from .runtime import Runtime, make_runtime
from .trainer import Trainer
from . import algorithms, tasks  # noqa: F401  (their modules fill hasten.registry: every method and task)

__all__ = ["Algorithm", "Callback", "Engine", "Event", "Interval", "NonFiniteLossError", "Runtime", "State", "Time",
           "Timestamp", "TimeUnit", "Trainer", "__version__", "make_runtime"]
