"""Files a command writes into a folder the user names, and never a file it did not write.

The rule for every command that writes output (`hasten compress`, `hasten bench`, `hasten
tune`): each such folder keeps an index of the files hasten wrote there, with each file's
SHA-256. A file in the way is replaced (or appended to) only when the index lists it with the
content it still has; anything else is refused, before any work starts, in one line naming the
file and the fix. Writing follows a claim-then-record protocol: the files are listed as
*pending* before they are written and with their content after, so a command stopped half-way
leaves its files claimed and the next run may replace them.

Folders written before the index existed are adopted only where a command can prove the folder
is its own from what it holds (for example a `runs.jsonl` of bench records); the caller names
that proof (`legacy`). Run folders and checkpoint folders follow their own, older form of the
same rule (`hasten.runs`, `hasten.callbacks.checkpoint`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable

from .errors import ConfigError
from .files import FolderLock, atomic_write, file_digest

INDEX = ".hasten-outputs.json"


def read_index(folder: Path, name: str = INDEX) -> dict:
    """relative path -> {"sha256", ...} of the files hasten wrote in `folder` (an index that
    cannot be read lists nothing: nothing is then proved hasten's)."""
    try:
        data = json.loads((Path(folder) / name).read_text())
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict):
        return {}
    return {k: v for k, v in files.items()
            if isinstance(v, dict) and (isinstance(v.get("sha256"), str) or v.get("pending") is True)}


def owned(path: Path, entry: "dict | None") -> bool:
    """Listed with the content it has now, or claimed by a command stopped before it could
    record what it wrote."""
    return (entry is not None and path.is_file() and not path.is_symlink()
            and (entry.get("pending") is True or file_digest(path) == entry.get("sha256")))


def update(folder: Path, names: Iterable[str], pending: bool, extra: "dict | None" = None,
           name: str = INDEX) -> None:
    """Claim (`pending=True`, before writing) or record (after) `names` in `folder`'s index;
    a name whose file is not there after writing leaves the index."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    index = read_index(folder, name)
    for n in names:
        p = folder / n
        if pending:
            index[n] = {"sha256": None, "pending": True, **(extra or {})}
        elif p.is_file():
            index[n] = {"sha256": file_digest(p), **(extra or {})}
        else:
            index.pop(n, None)
    atomic_write(folder / name, lambda f: json.dump({"format": 1, "files": index}, f, indent=1), binary=False)


class Outputs:
    """The files one command writes in `folder` (paths relative to it). `check` refuses, in one
    line, any of them that is in the way and not hasten's; `write` writes one atomically under
    the claim-then-record protocol; `lock` keeps a second command out of the folder while this
    one writes (two tunes into one --out).

    `legacy(folder)` may prove that a folder without an index is this command's own (written
    before the index existed); its files are then adopted. `appended` names files the command
    only appends to (a log of records), with what proves one is its own from its content: every
    complete line a record of the command's (their digest changes with every append)."""

    def __init__(self, folder: "str | os.PathLike", command: str, legacy: "Callable[[Path], bool] | None" = None,
                 appended: "dict[str, Callable[[Path], bool]] | None" = None):
        self.folder, self.command, self.legacy = Path(folder), command, legacy
        self.appended = appended or {}
        self._lock: FolderLock | None = None

    def foreign(self, names: Iterable[str]) -> list[Path]:
        """The files among `names` that are in the way and not provably hasten's."""
        index = read_index(self.folder)
        adopted = not (self.folder / INDEX).exists() and self.legacy is not None and self.legacy(self.folder)
        out = []
        for n in names:
            p = self.folder / n
            if not os.path.lexists(p):
                continue
            if (adopted or n in self.appended and self.appended[n](p)) and p.is_file() and not p.is_symlink():
                continue
            if not owned(p, index.get(n)):
                out.append(p)
        return out

    def check(self, names: Iterable[str], hint: str) -> None:
        """A ConfigError naming the first file in the way that hasten did not write (or that
        was changed since), with `hint` (how to choose another folder)."""
        if self.folder.exists() and not self.folder.is_dir():
            raise ConfigError(f"{self.folder} is a file, not a folder; {hint}")
        bad = self.foreign(names)
        if bad:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            raise ConfigError(f"{bad[0]} exists and {self.command} did not write it (or it was changed since){more}; "
                              f"{self.command} overwrites only its own files: {hint}")

    def adopt(self, names: Iterable[str]) -> None:
        """Record files of a legacy folder as hasten's (after `check` adopted them)."""
        present = [n for n in names if (self.folder / n).is_file()]
        if present and not (self.folder / INDEX).exists():
            update(self.folder, present, pending=False)

    def claim(self, names: Iterable[str]) -> None:
        update(self.folder, list(names), pending=True)

    def record(self, names: Iterable[str]) -> None:
        update(self.folder, list(names), pending=False)

    def write(self, name: str, write: Callable, binary: bool = False) -> Path:
        """Write `name` atomically (`write(f)` fills the file), claimed before and recorded after."""
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        self.claim([name])
        atomic_write(path, write, binary=binary)
        self.record([name])
        return path

    def lock(self, what: str) -> "Outputs":
        """Hold the folder's lock until `unlock` (or the process ends): a ConfigError when
        another hasten command holds it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = FolderLock(self.folder, what)
        self._lock.acquire()
        return self

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
