"""Typed time: durations and intervals in epochs, batches, samples, tokens,
fractions of the run, or wall-clock seconds.

    Time.parse("10ep"), Time.parse("500ba"), Time.parse("2e6tok"), Time.parse("64sp"),
    Time.parse("0.5dur"), Time.parse("90s"), Time.parse("5m"), Time.parse("1h")

`Timestamp` is where training stands, in every unit at once.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import asdict, dataclass
from enum import Enum


class TimeUnit(str, Enum):
    EPOCH = "ep"
    BATCH = "ba"
    SAMPLE = "sp"
    TOKEN = "tok"
    DURATION = "dur"
    SECOND = "s"


_SUFFIXES = {"ep": TimeUnit.EPOCH, "ba": TimeUnit.BATCH, "sp": TimeUnit.SAMPLE,
             "tok": TimeUnit.TOKEN, "dur": TimeUnit.DURATION, "s": TimeUnit.SECOND,
             "m": TimeUnit.SECOND, "h": TimeUnit.SECOND}
_SCALE = {"m": 60.0, "h": 3600.0}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(ep|ba|sp|tok|dur|s|m|h)\s*$")
_INTEGER_UNITS = (TimeUnit.EPOCH, TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN)
_FIELD = {TimeUnit.EPOCH: "epoch", TimeUnit.BATCH: "batch", TimeUnit.SAMPLE: "sample", TimeUnit.TOKEN: "token",
          TimeUnit.SECOND: "train_seconds"}
_FIELD.update({u.value: f for u, f in list(_FIELD.items())})


@dataclass(frozen=True)
class Time:
    """A non-negative amount of training time in one unit."""

    value: float
    unit: TimeUnit

    def __post_init__(self):
        object.__setattr__(self, "unit", TimeUnit(self.unit))
        if not (isinstance(self.value, (int, float)) and math.isfinite(self.value) and self.value >= 0):
            raise ValueError(f"Time value must be a finite number >= 0, got {self.value!r}")
        if self.unit in _INTEGER_UNITS:
            if float(self.value) != int(self.value):
                raise ValueError(f"{self.value}{self.unit.value}: {self.unit.name.lower()}s must be a whole number")
            object.__setattr__(self, "value", int(self.value))
        if self.unit == TimeUnit.DURATION and self.value > 1:
            raise ValueError(f"{self.value}dur: a fraction of the run must lie in [0, 1]")

    @classmethod
    def parse(cls, text: "str | Time") -> "Time":
        if isinstance(text, Time):
            return text
        if not isinstance(text, str):
            raise TypeError(f"expected a time string such as '10ep' or '500ba', got {text!r}")
        m = _PATTERN.match(text)
        if not m:
            raise ValueError(
                f"cannot read {text!r} as a time; write a number and a unit: "
                "ep (epochs), ba (batches), sp (samples), tok (tokens), dur (fraction of the run, 0..1), "
                "s, m or h (wall-clock), e.g. '10ep', '500ba', '2e6tok', '0.5dur', '90s'")
        number, suffix = float(m.group(1)), m.group(2)
        return cls(number * _SCALE.get(suffix, 1.0), _SUFFIXES[suffix])

    def __str__(self) -> str:
        v = self.value
        return f"{v:g}{self.unit.value}" if isinstance(v, float) else f"{v}{self.unit.value}"

    def _check(self, other: "Time") -> None:
        if not isinstance(other, Time):
            raise TypeError(f"cannot compare Time with {type(other).__name__}")
        if other.unit != self.unit:
            raise ValueError(f"cannot compare {self} with {other}: units differ")

    def __lt__(self, other):
        self._check(other)
        return self.value < other.value

    def __le__(self, other):
        self._check(other)
        return self.value <= other.value

    def __gt__(self, other):
        self._check(other)
        return self.value > other.value

    def __ge__(self, other):
        self._check(other)
        return self.value >= other.value

    def __add__(self, other: "Time") -> "Time":
        self._check(other)
        return Time(self.value + other.value, self.unit)


def as_time(value: "str | float | Time", name: str = "time") -> Time:
    """A typed time from a typed-time string ('200ba', '2ep', '0.5dur') or a bare number, the
    shorthand for a fraction of the run ('dur'); bare numbers must lie in [0, 1]."""
    if isinstance(value, Time):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name}={value!r}: a bare number is a fraction of the run and must lie in [0, 1]; "
                             "or give a typed time such as '200ba' or '2ep'")
        return Time(float(value), TimeUnit.DURATION)
    t = Time.parse(value)
    if t.unit == TimeUnit.DURATION and not 0.0 <= t.value <= 1.0:
        raise ValueError(f"{name}={value!r}: a fraction of the run must lie in [0, 1]")
    if t.value < 0:
        raise ValueError(f"{name}={value!r} is negative")
    return t


@dataclass
class Timestamp:
    """Where training stands. Counts are of completed work."""

    epoch: int = 0
    batch: int = 0            # optimizer steps taken
    sample: int = 0
    token: int = 0
    batch_in_epoch: int = 0
    sample_in_epoch: int = 0
    token_in_epoch: int = 0
    train_seconds: float = 0.0  # wall-clock spent in training steps (eval excluded)

    def get(self, unit: TimeUnit) -> float:
        return getattr(self, _FIELD[unit])

    def advance(self, samples: int, tokens: int, seconds: float) -> None:
        """Count one finished optimizer step."""
        self.batch += 1
        self.batch_in_epoch += 1
        self.sample += samples
        self.sample_in_epoch += samples
        self.token += tokens
        self.token_in_epoch += tokens
        self.train_seconds += seconds

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, d: dict) -> None:
        """Restore from `state_dict()`'s form, checked: a ValueError names what does not fit."""
        problem = Timestamp.problem(d)
        if problem:
            raise ValueError(f"timestamp {problem}")
        for k, v in d.items():
            setattr(self, k, float(v) if k == "train_seconds" else v)

    @staticmethod
    def problem(d) -> "str | None":
        """What keeps `d` from being a stored timestamp (None: nothing)."""
        if not isinstance(d, dict):
            return f"is {type(d).__name__}, not a mapping of counts"
        fields = [f.name for f in dataclasses.fields(Timestamp)]
        for k, v in d.items():
            if k not in fields:
                return f"has an unknown field {str(k)[:40]!r} (it holds {', '.join(fields)})"
            if isinstance(v, bool) or not isinstance(v, (int, float) if k == "train_seconds" else int):
                return f"field {k} is {str(v)[:40]!r}, not a {'number' if k == 'train_seconds' else 'whole number'}"
            if not math.isfinite(v) or v < 0:
                return f"field {k} is {v}, not a count >= 0"
        return None


class Interval:
    """Fires every `every` of training time. Used for eval, checkpoint and log intervals.

    `due` is asked at every batch end (and, for epoch intervals, at every epoch end). It
    remembers the index of the last period it fired in; `start` sets that index from the
    timestamp at the start of fit, so nothing needs saving: after a resume it counts on
    from the restored timestamp.
    """

    def __init__(self, every: "Time | str"):
        self.every = Time.parse(every)
        if self.every.value <= 0:
            raise ValueError(f"an interval must be > 0, got {self.every}")
        self._last: int | None = None
        self._field = _FIELD.get(self.every.unit)   # None for fractions of the run
        self._n = self.every.value
        self._epochs = self.every.unit == TimeUnit.EPOCH

    @property
    def needs_progress(self) -> bool:
        """True when the interval is a fraction of the run ('0.1dur'): `due` then reads `progress`."""
        return self._field is None

    def _index(self, ts: Timestamp, progress: float) -> int:
        if self._field is None:
            return int(math.floor(progress / self._n + 1e-9))
        return int(getattr(ts, self._field) // self._n)

    def start(self, ts: Timestamp, progress: float) -> None:
        """Count from here: called at the start of fit (also after a resume)."""
        self._last = self._index(ts, progress)

    def due(self, ts: Timestamp, progress: float, epoch_end: bool = False) -> bool:
        """True once each time training crosses into a new period of `every`."""
        if self._epochs != epoch_end:
            return False
        i = self._index(ts, progress)
        if self._last is None:
            self._last = 0
        if i > self._last:
            self._last = i
            return True
        return False

    def next_batch_due(self) -> float | None:
        """The batch count at which `due` fires next at a batch end; inf when it never does
        (epoch intervals fire at epoch ends); None when that cannot be known in advance
        (samples, tokens, fractions of the run, wall-clock)."""
        if self._epochs:
            return math.inf
        if self._field != "batch":
            return None
        return ((self._last or 0) + 1) * self._n

    def reset(self) -> None:
        self._last = None

    def __repr__(self) -> str:
        return f"Interval({self.every})"
