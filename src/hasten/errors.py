"""hasten's own errors: each message names the problem and the fix in one line.

Everything a user can cause (a wrong key or value, a missing or damaged file, a folder in
use by another run, a checkpoint of another model) raises a `HastenError`. The command
line prints such errors as one line (`hasten: error: ...`) and exits non-zero; `--debug`
or `HASTEN_DEBUG=1` shows the traceback too. This module imports nothing of hasten's, so
every other module can use it.
"""
from __future__ import annotations

import re
from typing import NamedTuple


class WorkerReport(NamedTuple):
    """An exception raised in another process or thread and re-raised here by torch (a
    DataLoader worker, the pin-memory thread): the original's type name, its message, where it
    was raised, and its traceback as torch carried it."""
    type_name: str
    message: str
    where: str
    traceback: str


# torch.utils.data re-raises an error of a loader worker as `type("Caught T in DataLoader worker
# process N.\nOriginal Traceback (most recent call last):\n...")` (torch._utils.ExceptionWrapper)
_CARRIED = re.compile(r"Caught (?P<type>\w+) (?P<where>in [^\n]*?)\.\nOriginal (?P<trace>Traceback \(most recent "
                      r"call last\):\n.*)", re.S)


def worker_report(text) -> "WorkerReport | None":
    """The original error inside torch's re-raised message `text`, or None when `text` is not
    one. The message is what the original exception said, recovered from the last line of its
    traceback (`module.Type: message`)."""
    if not isinstance(text, str):
        return None
    m = _CARRIED.match(text)
    if m is None:
        return None
    name, trace = m["type"], m["trace"].rstrip("\n")
    # the exception's line: 'pkg.mod.Type: message' (or 'Type: message' for builtins), the last one in the
    # traceback that names the type (chained exceptions come before it, notes after it)
    found = [x for x in re.finditer(rf"^(?:[\w.]+\.)?{re.escape(name)}(?:: (?P<msg>.*))?$", trace, re.M)]
    if found:
        last = found[-1]
        message = trace[last.start("msg"):] if last["msg"] is not None else ""
    else:
        message = trace.splitlines()[-1]
    return WorkerReport(name, message.strip(), m["where"], trace)


class HastenError(Exception):
    """A problem the user can fix; the message says how.

    Raised in a DataLoader worker, it reaches the main process through torch, which rebuilds it
    from the worker's whole traceback; hasten's error takes back the worker's own message, so the
    user reads the same one line whatever the worker count. The worker's traceback stays on
    `.worker` (and as a note, shown with --debug)."""

    worker: "WorkerReport | None" = None

    def __init__(self, *args):
        self.worker = worker_report(args[0]) if len(args) == 1 else None
        if self.worker is not None and self.worker.type_name == type(self).__name__:
            args = (self.worker.message,)
        else:
            self.worker = None
        super().__init__(*args)
        if self.worker is not None and hasattr(self, "add_note"):   # Python 3.11+
            self.add_note(f"raised {self.worker.where}:\n{self.worker.traceback}")


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
