"""The small kernel: events, typed time, state, algorithms, callbacks and the engine."""
from .algorithm import Algorithm
from .callback import Callback
from .engine import Engine
from .event import Event
from .state import NonFiniteLossError, State
from .time import Interval, Time, Timestamp, TimeUnit, as_time

__all__ = ["Algorithm", "Callback", "Engine", "Event", "Interval", "NonFiniteLossError", "State", "Time", "Timestamp", "TimeUnit", "as_time"]
