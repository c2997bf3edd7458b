"""The schema helpers: typed settings with their allowed values declared where they are
declared, and the coercion that turns YAML values into them.

`setting(default, ge=..., lt=..., time=True, check=...)` is a dataclass field whose metadata
states its range; `check_setting(field, value, path)` enforces it when a recipe is loaded,
so a value out of range is a one-line ConfigError naming the key, the allowed range and
the value given, before anything is built. The config classes of every section and task
declare their fields this way; this module imports nothing of hasten's but its errors
and typed time, so any config class can use it.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import re
import types
import typing
from typing import Any, Callable, Literal, Protocol, Union

from .core.time import Time
from .errors import ArgumentTypeError, ConfigError, brief

_MISSING = dataclasses.MISSING
NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)$")


class UnknownKey(ConfigError):
    """A key a section does not have (`section`, `key`): the recipe's loader adds where the key
    does live when another section has it (`trainer.lr` -> `optimizer.lr`) to `base`, the
    message without its closest-match suggestion."""

    def __init__(self, section: str, key: str, allowed: list):
        where = f"{section}.{key}" if section else key
        self.base = f"unknown key {where!r}; allowed keys here: {allowed}."
        super().__init__(self.base + suggest(key, allowed))
        self.section, self.key = section, key


def suggest(key: str, allowed) -> str:
    """' Did you mean X?' for the allowed value closest to `key`, or '' when none is close."""
    close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.5)
    return f" Did you mean {close[0]!r}?" if close else ""




def setting(default: Any = _MISSING, *, default_factory: Any = _MISSING, ge=None, gt=None, le=None, lt=None,
            time: bool = False, interval: bool = False, check: Callable[[Any], "str | None"] | None = None,
            recipe: bool = True):
    """A dataclass field with its allowed values: bounds (ge, gt, le, lt), `time=True` for a
    typed-time string ("500ba", "2ep", "0.5dur"), `interval=True` for a typed time that must be
    longer than zero (how often something happens), and `check(value) -> error text or None`.
    `recipe=False`: a Python-only option (a function, an object), left out of a recipe section
    made from its class (`recipe_section`)."""
    meta = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt), ("check", check)) if v is not None}
    if time or interval:
        meta["time"] = True
    if interval:
        meta["interval"] = True
    if not recipe:
        meta["recipe"] = False
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def _range(meta: dict) -> str:
    lo = (f">= {meta['ge']}" if "ge" in meta else f"> {meta['gt']}" if "gt" in meta else "")
    hi = (f"<= {meta['le']}" if "le" in meta else f"< {meta['lt']}" if "lt" in meta else "")
    return " and ".join(x for x in (lo, hi) if x)


def setting_problem(f: dataclasses.Field, value: Any) -> "str | None":
    """What is wrong with `value` for field `f` by what it declares (range, typed time, check),
    as the rest of a sentence about the value; None when nothing is (None always passes)."""
    meta = f.metadata
    if value is None or not meta:
        return None
    if "check" in meta and meta["check"](value):   # its own words first, where the field has them
        return meta["check"](value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        bad = (("ge" in meta and not value >= meta["ge"]) or ("gt" in meta and not value > meta["gt"])
               or ("le" in meta and not value <= meta["le"]) or ("lt" in meta and not value < meta["lt"]))
        if bad:
            return f"is out of range; it must be {_range(meta)}"
    if meta.get("time"):
        try:
            check_time(value, "", positive=meta.get("interval", False))
        except ConfigError as e:
            return str(e)[2:]   # check_time's words (they quote the value) without its empty path
    return None


def check_setting(f: dataclasses.Field, value: Any, path: str) -> None:
    """Raise ConfigError when `value` breaks what field `f` declares (None is always allowed
    where the type allows it)."""
    problem = setting_problem(f, value)
    if problem:
        quoted = problem.startswith(brief(value))
        raise ConfigError(f"{path}: {problem}" if quoted else f"{path}: {brief(value)} {problem}")


def check_arguments(obj) -> None:
    """The fields of an option group built in Python (a Trainer's keywords), each against its
    declaration: a value of another type is a TypeError, a value the field does not allow a
    ConfigError (a ValueError); both name it as `field=value` and say what it takes."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, tp = getattr(obj, f.name), hints[f.name]
        try:
            coerce(value, tp, f.name)
        except ConfigError:
            raise ArgumentTypeError(f"{f.name}={brief(value)}: expected {_type_name(tp)}") from None
        problem = setting_problem(f, value)
        if problem:
            raise ConfigError(f"{f.name}: {problem}" if problem.startswith(brief(value))
                              else f"{f.name}={brief(value)}: {problem}")


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


def three_numbers(value) -> str | None:
    """For an iteration's (a, b, c), such as Muon's Newton-Schulz coefficients."""
    if len(value) != 3:
        return "must hold three numbers (a, b, c)"
    return None


class DataSection(Protocol):
    """What every task's `data` section has: the global batch of one optimizer step."""
    batch_size: int


class ModelSection(Protocol):
    """What every task's `model` section has: the model's name (its YAML form may differ from
    its fields: `as_recipe()` where it does)."""
    name: str


# ------------------------------------------------------------------------------ coercion
def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin in (list, tuple):
        return "list"   # a YAML list either way
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp, path: str):
    """Check and convert `value` to type `tp`; errors name `path`."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{path}: {brief(value)} is not allowed; choose one of {list(allowed)}."
                              + (suggest(str(value), [str(a) for a in allowed]) if isinstance(value, str) else ""))
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(value, a, path)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{path}: expected {_type_name(tp)}, got {brief(value)}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {brief(value)}")
        (inner, *_) = typing.get_args(tp) or (Any,)
        items = [coerce(v, inner, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping (key: value), got {brief(value)}")
        key_type, value_type = typing.get_args(tp) or (Any, Any)
        return {coerce(k, key_type, f"{path}") if key_type is not Any else k: coerce(v, value_type, f"{path}.{k}")
                for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return value if isinstance(value, tp) else from_dict(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {brief(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            raise ConfigError(f"{path}: expected a whole number, got {brief(value)}")
        if not -2**63 <= int(value) < 2**63:   # what every consumer (torch, numpy, the clock) can hold
            raise ConfigError(f"{path}: {brief(value)} is out of range; give a whole number below 2**63")
        return int(value)
    if tp is float:
        if isinstance(value, str) and NUMBER.match(value):   # YAML 1.1 reads 1e-3 as a string
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {brief(value)}")
        if not math.isfinite(value):
            raise ConfigError(f"{path}: {brief(value)} is not a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{path}: expected a string, got {brief(value)}")
        return str(value)
    return value


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def from_dict(cls, data: dict | None, path: str = ""):
    """Build dataclass `cls` from a mapping, checking every key and value."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path or cls.__name__}: expected a mapping, got {brief(data)}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    names = list(fields)
    kwargs = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in names:
            raise UnknownKey(path, str(key), names)
        kwargs[key] = coerce(value, hints[key], where)
        check_setting(fields[key], kwargs[key], where)
    missing = [f.name for f in dataclasses.fields(cls)
               if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{path or cls.__name__}: missing required key(s) {missing}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path or cls.__name__}: {e}") from e


def signature_config(fn, params: dict, path: str) -> dict:
    """Check keyword arguments for a callable against its signature and annotations."""
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    allowed = [n for n, p in sig.parameters.items() if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    out = {}
    for key, value in (params or {}).items():
        where = f"{path}.{key}"
        if key not in allowed:
            raise ConfigError(f"unknown key {where!r}; allowed keys here: {allowed}.{suggest(str(key), allowed)}")
        out[key] = coerce(value, hints.get(key, Any), where)
    return out


def check_time(value: str, path: str, positive: bool = False) -> Time:
    """`value` as typed time, or a ConfigError naming `path`; `positive`: it must be longer than
    zero (an interval: how often something happens)."""
    try:
        t = Time.parse(value)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{path}: {e}") from e
    if positive and not t.value > 0:
        raise ConfigError(f"{path}: {brief(value)} is not an interval: give a typed time longer than zero, "
                          "e.g. 500ba, 1ep, 0.25dur or 30s")
    return t


# ---------------------------------------------------------------------------- the reference
def field_docs(cls) -> dict[str, str]:
    """The docstring under each field of dataclass `cls` (and its bases), read from the source
    (a class made by `recipe_section` carries those of the classes it was made from)."""
    import ast
    import textwrap
    if "__field_docs__" in vars(cls):
        return dict(cls.__field_docs__)
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                out[node.target.id] = " ".join(nxt.value.value.split())
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not _MISSING:
        v = f.default
    elif f.default_factory is not _MISSING:
        v = f.default_factory()
    else:
        return "(required)"
    return "null" if v is None else repr(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)


def _allowed(f: dataclasses.Field, tp) -> str:
    if typing.get_origin(tp) is Literal:
        return " \\| ".join(str(a) for a in typing.get_args(tp))
    meta = f.metadata
    parts = [_range(meta)] if _range(meta) else []
    if meta.get("interval"):
        parts.append("typed time > 0")
    elif meta.get("time"):
        parts.append("typed time")
    return ", ".join(parts)


def _yaml_type(tp):
    """`tp` as a recipe can give it: the Python-only members of a union (Time, objects) left out."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        kept = tuple(a for a in typing.get_args(tp) if not (isinstance(a, type) and a.__module__.startswith("hasten")))
        return Union[kept] if len(kept) > 1 else kept[0]
    return tp


def reference_table(cls, section: str) -> str:
    """A markdown table of `cls`'s fields: key, type, default, allowed values, description."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    rows = ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):   # a sub-section: its own table
            continue
        kind = "choice" if typing.get_origin(tp) is Literal else _type_name(_yaml_type(tp))
        rows.append(f"| `{section}.{f.name}` | {kind} | `{_default(f)}` | {_allowed(f, tp)} | "
                    f"{docs.get(f.name, '').replace('|', '/')} |")
    return "\n".join(rows)


def recipe_section(name: str, doc: str, groups: tuple, defaults: "dict[str, Any] | None" = None,
                   order: "tuple[str, ...] | None" = None) -> type:
    """A recipe section made of option groups: a dataclass with every field of `groups` that a
    recipe can hold (not `recipe=False`), each as its group declares it (type, range,
    docstring), so an option is declared once and read by the Python API and the recipe alike.
    `defaults`: the few fields whose default differs in a recipe, by name; `order`: the fields'
    order in the section (and in the reference, and in a run folder's recipe.yaml), all of them."""
    defaults = dict(defaults or {})
    fields, docs, seen = [], {}, set()
    for group in groups:
        hints, group_docs = typing.get_type_hints(group), field_docs(group)
        for f in dataclasses.fields(group):
            if f.metadata.get("recipe", True) is False:
                continue
            if f.name in seen:
                raise TypeError(f"{name}: {f.name} is declared by two groups")
            seen.add(f.name)
            if f.name in defaults:
                made = dataclasses.field(default=defaults.pop(f.name), metadata=f.metadata)
            elif f.default_factory is not _MISSING:
                made = dataclasses.field(default_factory=f.default_factory, metadata=f.metadata)
            else:
                made = dataclasses.field(default=f.default, metadata=f.metadata)
            fields.append((f.name, hints[f.name], made))
            docs[f.name] = group_docs.get(f.name, "")
    if defaults:
        raise TypeError(f"{name}: defaults for fields it does not have: {sorted(defaults)}")
    if order is not None:
        if sorted(order) != sorted(seen):
            raise TypeError(f"{name}: order lists {sorted(set(order) ^ seen)} differently from the groups' fields")
        fields.sort(key=lambda f: order.index(f[0]))
    cls = dataclasses.make_dataclass(name, fields)
    cls.__doc__, cls.__field_docs__, cls.__groups__ = doc, docs, groups
    return cls


def group_from(group: type, section, **given):
    """The option group `group` from a recipe section made of it (`recipe_section`): each of its
    recipe fields read from the section by name (the section has them all), plus `given`."""
    values = {f.name: getattr(section, f.name) for f in dataclasses.fields(group) if f.metadata.get("recipe", True)}
    return group(**{**values, **given})
