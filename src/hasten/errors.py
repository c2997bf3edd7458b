"""hasten's own errors: each message names the problem and the fix in one line.

Everything a user can cause (a wrong key or value, a missing or damaged file, a folder in
use by another run, a checkpoint of another model) raises a `HastenError`. The command
line prints such errors as one line (`hasten: error: ...`) and exits non-zero; `--debug`
or `HASTEN_DEBUG=1` shows the traceback too. This module imports nothing of hasten's, so
every other module can use it.
"""
from __future__ import annotations


class HastenError(Exception):
    """A problem the user can fix; the message says how."""


class ConfigError(HastenError, ValueError):
    """A recipe, override or argument that is not allowed."""


class ArgumentTypeError(ConfigError, TypeError):
    """An argument of another type than the option takes (a ValueError and a TypeError alike)."""


class CheckpointError(HastenError, RuntimeError):
    """A checkpoint that cannot be written or read, or belongs to something else."""


class DataError(HastenError, ValueError):
    """A data file that is missing, empty, damaged or of the wrong kind."""


class RunFolderError(HastenError, RuntimeError):
    """A run or checkpoint folder that cannot be used: in use, not writable, or another run's."""


class BusyMachineError(HastenError, RuntimeError):
    """A measurement refused because other processes held the cores while it ran."""


class TrainingError(HastenError, RuntimeError):
    """A fault found while training that the user's code or data caused (e.g. a loss
    function that cannot take the model's outputs)."""


def first_line(e: BaseException) -> str:
    """The first non-empty line of an exception's message, without its final full stop: what
    hasten quotes from another library's error inside its own one-line message."""
    return next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "").rstrip(".")


def _make_brief():
    import reprlib
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 3, 60, 60, 40
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 6
    return r.repr


_brief = _make_brief()


def brief(value, limit: int = 200) -> str:
    """`repr(value)` bounded in depth, length and size (at most `limit` characters): what an
    error message quotes of a value a user gave, however large or deeply nested it is."""
    text = _brief(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
