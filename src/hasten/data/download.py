"""Downloads with checksums, and where datasets live on disk.

Datasets are looked for, and downloaded to, `$HASTEN_DATA` (default ~/.cache/hasten/data).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import ConfigError, DataError, HastenError
from ..files import file_digest


class DatasetNotFoundError(HastenError, FileNotFoundError):
    pass


class ChecksumError(DataError):
    pass


def data_root() -> Path:
    """Where hasten keeps downloads and caches: HASTEN_DATA, else ~/.cache/hasten/data. A
    HASTEN_DATA that is not a folder (a file) is a ConfigError naming it."""
    root = Path(os.environ.get("HASTEN_DATA", Path.home() / ".cache" / "hasten" / "data")).expanduser()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"HASTEN_DATA={root} is a file, not a folder; point it at a folder for hasten's downloads "
                          "and caches (or unset it for ~/.cache/hasten/data)")
    return root


def download(url: str, dest: "str | os.PathLike", checksum: str | None = None, algorithm: str = "md5",
             what: str = "the file") -> Path:
    """Fetch `url` to `dest` (atomically), verifying `checksum` with `algorithm`. A download that
    fails leaves nothing: neither its temporary file nor the folders it made for `dest`."""
    dest = Path(dest)
    made = [p for p in [dest.parent, *dest.parent.parents] if not p.exists()]
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    done = False
    try:
        try:
            with urllib.request.urlopen(url, timeout=60) as r, os.fdopen(fd, "wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise DatasetNotFoundError(
                f"could not download {what} from {url} ({e}). If this machine has no internet, "
                f"download it elsewhere and put it at {dest}, or point the recipe at a local copy "
                "(data.path=...).") from e
        if checksum is not None:
            got = file_digest(tmp, algorithm)
            if got != checksum:
                raise ChecksumError(f"{what} downloaded from {url} has {algorithm} {got}, expected {checksum}: "
                                    "the download is corrupt or the file changed. It was deleted; try again.")
        os.replace(tmp, dest)
        done = True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if not done:
            for folder in made:   # innermost first; only the folders this call made, and only when empty
                try:
                    folder.rmdir()
                except OSError:
                    break
    return dest
