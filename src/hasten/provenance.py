"""The code behind a figure: which hasten produced a result.

`code_version()` returns the package version, a SHA-256 over hasten's own source files
(the same files give the same hash, whether installed from a wheel or run from a
checkout), and, where the package runs from a git checkout, the commit and whether tracked
files differ from it. Bench records and benchmark result files carry it; reports print it.
"""
from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

from . import __version__

_PACKAGE = Path(__file__).resolve().parent


def source_hash(root: Path = _PACKAGE) -> str:
    """SHA-256 over every .py and .yaml file under `root`, by relative path and content."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.suffix in (".py", ".yaml") and p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _git(*args: str, cwd: Path) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


@functools.cache
def code_version() -> dict:
    """{"hasten", "source_sha256", "commit", "dirty"}; commit and dirty are None outside a checkout."""
    out = {"hasten": __version__, "source_sha256": source_hash(), "commit": None, "dirty": None}
    top = _git("rev-parse", "--show-toplevel", cwd=_PACKAGE)
    if top and _PACKAGE.is_relative_to(Path(top).resolve()):
        out["commit"] = _git("rev-parse", "HEAD", cwd=_PACKAGE)
        status = _git("status", "--porcelain", "--untracked-files=no", cwd=_PACKAGE)
        out["dirty"] = bool(status) if status is not None else None
    return out


def describe(code: dict | None) -> str:
    """One line for reports: 'commit 1a2b3c4d (with uncommitted changes), hasten 0.1.0, source sha256 9f8e7d6c'."""
    if not code:
        return "code not recorded (a record from before hasten recorded it)"
    parts = []
    if code.get("commit"):
        parts.append(f"commit {code['commit'][:10]}" + (" (with uncommitted changes)" if code.get("dirty") else ""))
    parts.append(f"hasten {code.get('hasten')}")
    parts.append(f"source sha256 {str(code.get('source_sha256'))[:12]}")
    return ", ".join(parts)
