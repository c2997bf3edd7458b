"""Code a recipe names: a user's model class or data function, imported by its path.

    model: {name: my_pkg.models:Net, width: 64}     # my_pkg.models.Net(width=64)
    data:  {factory: my_pkg.data:loaders, factory_args: {root: data/}, batch_size: 128}

A name with a colon is `module:attribute` (the attribute may be dotted: `mod:Outer.inner`).
The module is imported as Python imports it; the current directory is searched too (as
`python -m` does), so a package beside the recipe needs no installing.

Trust: a recipe that names code runs that code, exactly as `python my_script.py` would. A
recipe you wrote is trusted by definition. A run folder or artifact that someone else wrote
is not: `hasten train --resume`, `hasten compress` and `hasten eval` say which code they are
about to import before importing it, and refuse without `--trust-code` when the folder or
file belongs to another user (see `check_trust`).
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any

from .errors import ConfigError, HastenError, first_line


def is_target(name: Any) -> bool:
    """Whether a recipe's name is an import path (`module:attribute`)."""
    return isinstance(name, str) and ":" in name and not name.startswith("hf/")


def _check_syntax(path: str, key: str) -> tuple[str, str]:
    module, _, attr = path.partition(":")
    if not module or not attr or not all(p.isidentifier() for p in module.split(".") + attr.split(".")):
        raise ConfigError(f"{key}: {path!r} is not an import path; write it as module:attribute, "
                          "e.g. my_pkg.models:Net")
    return module, attr


def check_target(path: str, key: str) -> str:
    """The path's syntax, checked without importing anything (what validating a recipe does)."""
    _check_syntax(path, key)
    return path


def load(path: str, key: str) -> Any:
    """The object `module:attribute` names; a one-line ConfigError when it cannot be imported."""
    module_name, attr = _check_syntax(path, key)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)   # after everything installed: the current folder never shadows a package
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing = e.name or module_name
        raise ConfigError(f"{key}: cannot import {module_name!r} for {path} (no module named {missing!r}); install "
                          "it, or run hasten from the folder that holds it") from None
    except HastenError:
        raise
    except Exception as e:   # the user's module itself failed while importing
        raise ConfigError(f"{key}: importing {module_name!r} for {path} failed: {type(e).__name__}: {first_line(e)}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{key}: {module_name!r} has no attribute {attr!r} (for {path}); it has "
                              f"{sorted(n for n in dir(obj) if not n.startswith('_'))[:12]}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{key}: {path} is a {type(obj).__name__}, not a class or function to call")
    return obj


def accepts(fn, name: str) -> bool:
    """Whether `fn` takes a keyword argument `name` (or any keyword)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or p.kind == p.VAR_KEYWORD
               for p in params)


def call(path: str, key: str, kwargs: dict, offered: dict | None = None) -> Any:
    """Import `path` and call it with `kwargs`, plus each of `offered` (what the task knows,
    e.g. `num_classes`, `vocab_size`) that it accepts by name and `kwargs` does not give.
    A missing or unknown argument, or an error raised inside, is a one-line ConfigError."""
    fn = load(path, key)
    args = dict(kwargs)
    for name, value in (offered or {}).items():
        if name not in args and value is not None and accepts(fn, name):
            args[name] = value
    try:
        inspect.signature(fn).bind(**args)
    except TypeError as e:
        raise ConfigError(f"{key}: {path}({', '.join(f'{k}=...' for k in args)}): {e}; give its arguments beside "
                          f"the name in the recipe") from None
    except ValueError:   # no signature to check (a builtin): call and see
        pass
    try:
        return fn(**args)
    except HastenError:
        raise
    except Exception as e:
        raise ConfigError(f"{key}: {path} raised {type(e).__name__}: {first_line(e)}") from e


def build_module(path: str, kwargs: dict, offered: dict | None = None, key: str = "model.name"):
    """A user's `nn.Module` from its class or factory; anything else is refused in one line."""
    import torch.nn as nn
    model = call(path, key, kwargs, offered)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{key}: {path} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def targets_in(recipe: dict) -> list[str]:
    """The import paths a recipe (as a dict, e.g. a run folder's recipe.yaml) names."""
    found = []
    model, data = recipe.get("model") or {}, recipe.get("data") or {}
    if isinstance(model, dict) and is_target(model.get("name")):
        found.append(model["name"])
    if isinstance(data, dict) and isinstance(data.get("factory"), str):
        found.append(data["factory"])
    return found


def check_trust(path: "str | Path", recipe: dict, trust: bool, what: str, say=None) -> None:
    """Before importing the code a stored recipe names (a run folder being resumed or
    compressed, an artifact being evaluated): say which code will run; refuse when `path`
    belongs to another user, unless `trust` (--trust-code). Files of this user are this
    user's own doing; another user's files could name any code."""
    targets = targets_in(recipe)
    if not targets:
        return
    say = say or (lambda msg: print(msg, file=sys.stderr))
    p = Path(path)
    try:
        owner = p.stat().st_uid
    except OSError:
        owner = None
    mine = owner is None or not hasattr(os, "getuid") or owner == os.getuid()
    if not mine and not trust:
        raise ConfigError(f"{p} belongs to another user (uid {owner}) and its recipe imports {', '.join(targets)}; "
                          f"{what} would run that code: pass --trust-code if you trust it")
    say(f"note: {what} imports {', '.join(targets)} as its recipe names (a recipe that names code runs it)")
