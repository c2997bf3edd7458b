"""Files hasten writes: atomic writes that follow the umask, and one writer per folder.

- `atomic_write(path, write)`: a temporary file beside the target, fsync, rename, fsync of
  the folder; the target is either the old file or the new one, never a torn mix. The new
  file gets the mode any other file of the run gets (0666 less the umask), not the 0600 of
  a temporary file.
- `FolderLock`: an advisory lock (flock) on a folder, so that two processes never write the
  same run or checkpoint folder (two autoresumes of one run). The operating system drops
  it when the process dies, even by SIGKILL. Locks on network file systems depend on the
  file system's support for flock.
- Disk full and permission errors become `RunFolderError`/`CheckpointError` messages that
  name the file and the fix.
"""
from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable

from .errors import HastenError, RunFolderError

try:
    import fcntl
except ImportError:   # Windows: no advisory locks; one writer per folder is then the user's to keep
    fcntl = None

LOCK_NAME = ".hasten.lock"


def _read_umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)   # no reader elsewhere: set and put back at once
    os.umask(old)
    return old


def file_mode() -> int:
    """The mode a newly created file gets under the current umask."""
    return 0o666 & ~_read_umask()


def os_error_message(e: OSError, path, doing: str) -> str:
    """One line for an OSError while `doing` something with `path`, with the fix."""
    if e.errno == errno.ENOSPC:
        return f"no space left on the device while {doing} {path}; free some space and try again"
    if e.errno == errno.EDQUOT:
        return f"disk quota exceeded while {doing} {path}; free some space and try again"
    if isinstance(e, PermissionError) or e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"no permission for {doing} {path} ({e.strerror}); choose a folder you can write"
    return f"{e.strerror or e} while {doing} {path}"


def atomic_write(path: "str | os.PathLike", write: Callable, binary: bool = True,
                 error: type[HastenError] = RunFolderError) -> None:
    """Write `path` atomically: `write(f)` fills a temporary file, which replaces `path`.

    A failure (disk full, a signal, a crash) leaves the old `path` as it was; the temporary
    file is removed (a SIGKILL can leave it: its name is `.NAME.*.tmp`, and
    hasten's checkpoint folders remove such leftovers at their next start)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        _discard(tmp)
        raise error(os_error_message(e, path, "writing")) from e
    except BaseException:
        _discard(tmp)
        raise


def _discard(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def fsync_dir(folder: "str | os.PathLike") -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_writable_dir(folder: "str | os.PathLike", what: str = "folder") -> Path:
    """Create `folder` if needed and prove that files can be written in it (a probe file is
    written and removed), so an unwritable folder is found before training time is spent."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".hasten-probe.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise RunFolderError(os_error_message(e, folder, f"writing in the {what}")) from e
    return folder


class FolderLock:
    """One writer per folder: `acquire()` raises RunFolderError when another process holds it."""

    def __init__(self, folder: "str | os.PathLike", what: str = "folder"):
        self.folder, self.what = Path(folder), what
        self._f = None

    @property
    def held(self) -> bool:
        return self._f is not None

    def acquire(self) -> "FolderLock":
        if self._f is not None or fcntl is None:
            return self
        path = self.folder / LOCK_NAME
        try:
            f = open(path, "a+")
        except OSError as e:
            raise RunFolderError(os_error_message(e, path, f"locking the {self.what}")) from e
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            owner = f.read().strip() or "another process"
            f.close()
            raise RunFolderError(
                f"the {self.what} {self.folder} is in use by {owner}; wait for it to finish or stop it, "
                "or choose another folder (two processes must not write one run)") from None
        f.seek(0)
        f.truncate()
        f.write(f"hasten process {os.getpid()}\n")
        f.flush()
        self._f = f
        return self

    def release(self) -> None:
        if self._f is not None:
            try:
                fcntl.flock(self._f.fileno(), fcntl.LOCK_UN)
            finally:
                self._f.close()
                self._f = None

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


def file_digest(path: "str | os.PathLike", algorithm: str = "sha256") -> str:
    """The hex digest of a file's bytes, read in 1 MiB pieces."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
