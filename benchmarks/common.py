"""Shared bits of the benchmark scripts: machine description, result files, the allocator
environments child processes are measured under, and the mean ± sd of a table cell."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

try:
    from hasten.bench.recording import machine as hasten_machine
except ImportError:   # an older checkout's src, measured side by side (trainer_instructions.py --src)
    from hasten.bench.worker import machine as hasten_machine
from hasten.provenance import code_version

RESULTS = Path(__file__).parent / "results"


def machine() -> dict:
    """hasten's machine description (the one `hasten bench` records), plus the load average."""
    return {**hasten_machine(), "loadavg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def git_commit(where: "Path | None" = None) -> str | None:
    """The short commit of the checkout holding `where` (default: these benchmarks)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=where or Path(__file__).parent).stdout.strip() or None
    except OSError:
        return None


def git_dirty(where: "Path | None" = None) -> bool | None:
    """Whether tracked files differ from the commit (results then come from uncommitted code)."""
    try:
        r = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=where or Path(__file__).parent)
    except OSError:
        return None
    return bool(r.stdout.strip()) if r.returncode == 0 else None


def portable(arg: str) -> str:
    """A command-line argument as a result file may record it: an absolute path (alone or after
    `KEY=`) inside this repository becomes relative to it, one inside a hasten run folder starts
    at `runs/`, any other keeps its last part only; the machine's own folders are not recorded."""
    key, sep, value = arg.rpartition("=") if "=" in arg else ("", "", arg)
    if not value.startswith("/"):
        return arg
    path, repo = Path(value), Path(__file__).resolve().parent.parent
    try:
        short = str(path.resolve().relative_to(repo))
    except ValueError:
        parts = path.parts
        short = "/".join(parts[parts.index("runs"):]) if "runs" in parts else path.name
    return key + sep + short


def glibc_env() -> dict:
    """This process's environment without glibc's MALLOC_* variables: a child process then runs
    under malloc's defaults, as a plain PyTorch script does."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}


def hasten_malloc() -> dict:
    """The four allocator settings `hasten train` applies on a CPU, as MALLOC_* variables for a
    child process that is not hasten's."""
    from hasten.allocator import ENV_VARS, MMAP_MAX, MMAP_THRESHOLD, TOP_PAD, TRIM_THRESHOLD
    return dict(zip(ENV_VARS, map(str, (MMAP_THRESHOLD, TRIM_THRESHOLD, TOP_PAD, MMAP_MAX))))


def mean_sd(xs, digits: int) -> str:
    """'mean ± sd' of `xs` to `digits` places (sd 0 for one value; '-' for none)."""
    if not xs:
        return "-"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.{digits}f} ± {sd:.{digits}f}"


def write_results(name: str, data: dict, markdown: str) -> tuple[Path, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "command": "python " + " ".join(portable(a) for a in sys.argv), "commit": git_commit(),
            "dirty": git_dirty(), "code": code_version(), "machine": machine(), **data}
    j, m = RESULTS / f"{name}.json", RESULTS / f"{name}.md"
    j.write_text(json.dumps(data, indent=2) + "\n")
    m.write_text(markdown.rstrip() + f"\n\nCommand: `{data['command']}` (commit {data['commit']}{', with uncommitted changes' if data['dirty'] else ''}); "
                 f"machine: {data['machine']['cpu']}, {data['machine']['cores']} cores, torch {data['machine']['torch']}.\n")
    return j, m
