"""Code a recipe names: a user's model class or data function, imported by its path.

    model: {name: my_pkg.models:Net, width: 64}     # my_pkg.models.Net(width=64)
    data:  {factory: my_pkg.data:loaders, factory_args: {root: data/}, batch_size: 128}

A name with a colon is `module:attribute` (the attribute may be dotted: `mod:Outer.inner`).
The module is imported as Python imports it; the current directory is searched too (as
`python -m` does), so a package beside the recipe needs no installing.

Trust, one rule: a recipe that names code runs that code, exactly as `python my_script.py`
would, so the code a recipe names is imported only when the file that named it (a recipe
file, any file of its `base:` chain, a run folder's `recipe.yaml`, an artifact) belongs to
the user running hasten, or the user passed `--trust-code`. The rule is checked in `load`,
the one function that imports code a recipe names, whatever the command (train, autoresume,
resume, bench, tune, compress, eval): the recipe loader records which file named each import
path (`Recipe.origins`) and building a task (`named_by`) hands that to `load`. Code named on
the command line, or importable from the environment the user set up (installed packages,
their PYTHONPATH, the working directory) and named by their own files, stays theirs to name.
`--trust-code` reaches the worker processes bench and tune start through the environment
(`HASTEN_TRUST_CODE=1`). Resume, compress and eval also say which code they are about to
import before importing it (`check_trust`).
"""
from __future__ import annotations

import contextlib
import contextvars
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


# ---------------------------------------------------------------------------- trust
TRUST_ENV = "HASTEN_TRUST_CODE"   # "1": --trust-code was given (worker processes inherit it)
CODE_KEYS = (("model", "name"), ("data", "factory"))   # the recipe keys that may name code
_trusting = contextvars.ContextVar("hasten_trusting", default=False)
_origins = contextvars.ContextVar("hasten_code_origins", default=None)


def trusted() -> bool:
    """Whether the user said to import code named by other users' files (--trust-code)."""
    return _trusting.get() or os.environ.get(TRUST_ENV) == "1"


def trust_code_here_and_in_workers() -> None:
    """--trust-code: for this process and every process it starts (bench and tune workers)."""
    os.environ[TRUST_ENV] = "1"


@contextlib.contextmanager
def trusting(on: bool = True):
    """Within the block, code named by other users' files is imported (the Python form of --trust-code)."""
    token = _trusting.set(bool(on) or _trusting.get())
    try:
        yield
    finally:
        _trusting.reset(token)


@contextlib.contextmanager
def named_by(origins: "dict[str, str | None] | None"):
    """Within the block, `load` knows which file named the code of each key ('model.name',
    'data.factory'): what building a recipe's task does (hasten.tasks.base.TaskSpec.make)."""
    token = _origins.set(dict(origins or {}))
    try:
        yield
    finally:
        _origins.reset(token)


def foreign_owner(path: "str | Path") -> "int | None":
    """The owner's uid of `path` when another user owns it; None when it is this user's (or
    cannot be told: no such file, no uids on this system)."""
    if not hasattr(os, "getuid"):
        return None
    try:
        owner = Path(path).stat().st_uid
    except OSError:
        return None
    return owner if owner != os.getuid() else None


def refusal(origin: "str | Path", targets: list[str], what: str) -> "ConfigError | None":
    """The one trust rule: the error that stops importing `targets` named by the file `origin`,
    or None when it may be imported (the file is this user's, or --trust-code)."""
    owner = foreign_owner(origin)
    if owner is None or trusted():
        return None
    return ConfigError(f"{origin} belongs to another user (uid {owner}) and its recipe imports {', '.join(targets)}; "
                       f"{what} would run that code: pass --trust-code if you trust it")


def origins_of(raw: dict, origin: "str | None") -> dict:
    """{'model.name': origin, ...} for each key of CODE_KEYS that the raw recipe `raw` sets."""
    out = {}
    for section, key in CODE_KEYS:
        if isinstance(raw.get(section), dict) and key in raw[section]:
            out[f"{section}.{key}"] = origin
    return out


def load(path: str, key: str) -> Any:
    """The object `module:attribute` names; a one-line ConfigError when it cannot be imported,
    or when the file that named it belongs to another user (the trust rule, above)."""
    module_name, attr = _check_syntax(path, key)
    origin = (_origins.get() or {}).get(key)
    if origin is not None:
        refused = refusal(origin, [path], f"{key}: importing {module_name!r}")
        if refused is not None:
            raise refused
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
    except SystemExit as e:   # a module that exits when imported (a script's guard missing)
        raise ConfigError(f"{key}: importing {module_name!r} for {path} called sys.exit({e.code!r}); a module hasten "
                          "imports must not exit at import (put the script's work under `if __name__ == "
                          "\"__main__\":`)") from None
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


def named_code(recipe: dict) -> dict[str, str]:
    """{'model.name': 'my_pkg.models:Net', 'data.factory': ...}: the import paths a recipe (as a
    dict, e.g. a run folder's recipe.yaml) names, by key."""
    found = {}
    model, data = recipe.get("model") or {}, recipe.get("data") or {}
    if isinstance(model, dict) and is_target(model.get("name")):
        found["model.name"] = model["name"]
    if isinstance(data, dict) and isinstance(data.get("factory"), str):
        found["data.factory"] = data["factory"]
    return found


def targets_in(recipe: dict) -> list[str]:
    """The import paths a recipe (as a dict) names."""
    return list(named_code(recipe).values())


def check_trust(named_by_file: "str | Path | dict", recipe: dict, trust: bool, what: str, say=None) -> None:
    """Before anything is built from a stored recipe (a run folder being resumed or
    compressed, an artifact being evaluated): say which code will run, and refuse at once by
    the trust rule (`refusal`; `trust`: --trust-code) instead of at the import.
    `named_by_file`: the file that named the recipe's code, or {key: file} (Recipe.origins)."""
    named = named_code(recipe)
    if not named:
        return
    origins = named_by_file if isinstance(named_by_file, dict) else {k: named_by_file for k in named}
    with trusting(trust):
        for key, target in named.items():
            refused = refusal(origins[key], [target], what) if origins.get(key) is not None else None
            if refused is not None:
                raise refused
    (say or (lambda msg: print(msg, file=sys.stderr)))(
        f"note: {what} imports {', '.join(named.values())} as its recipe names (a recipe that names code runs it)")
