"""Shared bits of the benchmark scripts: machine description, where a result goes (the results
record's layout: benchmarks.tools.results), the allocator environments child processes are
measured under, and the mean ± sd of a table cell. Scripts run from the repository's root as
modules (`python -m benchmarks.comparisons.NAME`)."""
from __future__ import annotations

import json
import shlex
import os
import statistics
import sys
from pathlib import Path

try:
    from hasten.bench.recording import machine as hasten_machine
except ImportError:   # an older checkout's src, measured side by side (trainer_instructions.py --src)
    from hasten.bench.worker import machine as hasten_machine
from hasten.provenance import code_version, git_output, machine_identity, tree_dirty

from benchmarks.tools import results as record

RESULTS = record.RESULTS
REPO = record.ROOT


def this_machine() -> str:
    """This machine's short name in the results record (epyc-bf16, xeon-amx, h200, ...)."""
    return record.short_machine(machine_identity())


def result_folder(name: str, subject: "str | None" = None) -> Path:
    """Where a `hasten bench` comparison named `name` run on this machine keeps its runs: its
    folder in the results record (the same folder when a stopped comparison continues)."""
    return record.place(subject or record.subject_of(name), name, this_machine())[0]


def machine() -> dict:
    """hasten's machine description (the one `hasten bench` records), plus the load average."""
    return {**hasten_machine(), "loadavg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def git_commit(where: "Path | None" = None) -> str | None:
    """The short commit of the checkout holding `where` (default: these benchmarks)."""
    return git_output("rev-parse", "--short", "HEAD", cwd=where or REPO) or None


def portable(arg: str) -> str:
    """A command-line argument as a result file may record it: an absolute path (alone or after
    `KEY=`) inside this repository becomes relative to it, one inside a hasten run folder starts
    at `runs/`, any other keeps its last part only; the machine's own folders are not recorded."""
    key, sep, value = arg.rpartition("=") if "=" in arg else ("", "", arg)
    if not value.startswith("/"):
        return arg
    path, repo = Path(value), REPO
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


def command_line() -> str:
    """This process's command as a reader would type it: `python -m benchmarks.x.y ARGS` for a
    benchmark run as a module, paths made portable."""
    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    if script is not None and script.suffix == ".py" and (REPO / "benchmarks") in script.parents:
        head = "python -m " + ".".join(script.relative_to(REPO).with_suffix("").parts)
    else:
        head = "python " + portable(sys.argv[0])
    return " ".join([head, *(shlex.quote(portable(a)) for a in sys.argv[1:])])


def write_results(name: str, data: dict, markdown: str, subject: "str | None" = None,
                  supersedes: "list[str] | None" = None) -> tuple[Path, Path]:
    """Record a result: its data (with the command, commit and machine) as result.json in its
    folder of the results record, its report in docs/results, its entry in the index (with the
    results it replaces, `supersedes`, by id)."""
    folder, report = record.place(subject or record.subject_of(name), name, this_machine())
    folder.mkdir(parents=True, exist_ok=True)
    report.parent.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "command": command_line(), "commit": git_commit(),
            "dirty": tree_dirty(REPO), "code": code_version(), "machine": machine(), **data}
    j = folder / "result.json"
    j.write_text(json.dumps(data, indent=2) + "\n")
    report.write_text(markdown.rstrip() + f"\n\nCommand: `{data['command']}` (commit {data['commit']}"
                      f"{', with uncommitted changes' if data['dirty'] else ''}); machine: {data['machine']['cpu']}, "
                      f"{data['machine']['cores']} cores, torch {data['machine']['torch']}.\n")
    record.register(folder, data["command"], data["commit"], supersedes)
    return j, report
