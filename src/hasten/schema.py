"""Settings with their allowed values declared where they are declared.

`setting(default, ge=..., lt=..., time=True, check=...)` is a dataclass field whose metadata
states its range; `check_setting(field, value, path)` enforces it when a recipe is loaded,
so a value out of range is a one-line ConfigError naming the key, the allowed range and
the value given, before anything is built. The config classes of every section and task
declare their fields this way; this module imports nothing of hasten's but its errors
and typed time, so any config class can use it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .core.time import Time
from .errors import ConfigError

_MISSING = dataclasses.MISSING


def setting(default: Any = _MISSING, *, default_factory: Any = _MISSING, ge=None, gt=None, le=None, lt=None,
            time: bool = False, check: Callable[[Any], "str | None"] | None = None):
    """A dataclass field with its allowed values: bounds (ge, gt, le, lt), `time=True` for a
    typed-time string ("500ba", "2ep", "0.5dur"), and `check(value) -> error text or None`."""
    meta = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt), ("check", check)) if v is not None}
    if time:
        meta["time"] = True
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def _range(meta: dict) -> str:
    lo = (f">= {meta['ge']}" if "ge" in meta else f"> {meta['gt']}" if "gt" in meta else "")
    hi = (f"<= {meta['le']}" if "le" in meta else f"< {meta['lt']}" if "lt" in meta else "")
    return " and ".join(x for x in (lo, hi) if x)


def check_setting(f: dataclasses.Field, value: Any, path: str) -> None:
    """Raise ConfigError when `value` breaks what field `f` declares (None is always allowed
    where the type allows it)."""
    meta = f.metadata
    if value is None or not meta:
        return
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        bad = (("ge" in meta and not value >= meta["ge"]) or ("gt" in meta and not value > meta["gt"])
               or ("le" in meta and not value <= meta["le"]) or ("lt" in meta and not value < meta["lt"]))
        if bad:
            raise ConfigError(f"{path}: {value!r} is out of range; it must be {_range(meta)}")
    if meta.get("time"):
        try:
            Time.parse(value)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{path}: {e}") from e
    if "check" in meta:
        problem = meta["check"](value)
        if problem:
            raise ConfigError(f"{path}: {value!r} {problem}")


def check_dataclass(obj, path: str = "") -> None:
    """Check every field of a dataclass instance against its declaration."""
    for f in dataclasses.fields(obj):
        check_setting(f, getattr(obj, f.name), f"{path}.{f.name}" if path else f.name)


def device_string(value) -> str | None:
    """Error text for a device that torch cannot name ('gpu'), None for a good one."""
    if value == "auto":
        return None
    import torch
    try:
        torch.device(value)
    except (RuntimeError, TypeError):
        return "is not a device; use auto, cpu, cuda, cuda:N or mps"
    return None


def fractions_below_one(value) -> str | None:
    """For Adam's betas: each in [0, 1)."""
    if not all(0.0 <= b < 1.0 for b in value):
        return "must hold numbers in [0, 1)"
    return None
