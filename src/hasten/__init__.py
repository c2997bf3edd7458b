"""hasten: make PyTorch training fast, and prove it.

    from hasten import Trainer, Algorithm, Callback, Event, Time
"""
__version__ = "0.1.0"

from .core import Algorithm, Callback, Engine, Event, Interval, NonFiniteLossError, State, Time, Timestamp, TimeUnit  # noqa: E402
from .runtime import Runtime, make_runtime  # noqa: E402
from .trainer import Trainer  # noqa: E402
from . import algorithms, tasks  # noqa: E402,F401  (their modules fill hasten.registry: every method and task)

__all__ = ["Algorithm", "Callback", "Engine", "Event", "Interval", "NonFiniteLossError", "Runtime", "State", "Time",
           "Timestamp", "TimeUnit", "Trainer", "__version__", "make_runtime"]
