"""The code behind a figure: which hasten produced a result.

`code_version()` returns the package version, a SHA-256 over hasten's own source files
(the same files give the same hash, whether installed from a wheel or run from a
checkout), and, where the package runs from a git checkout, the commit and whether tracked
files other than the results record differ from it (`tree_dirty`). Bench records and
benchmark result files carry it; reports print it.
"""
from __future__ import annotations

import datetime
import json
import re
import functools
import hashlib
import os
import subprocess
from pathlib import Path

from .hardware import cpu_features, cpu_name, describe_cpu, kernel_caps
from .version import __version__

_PACKAGE = Path(__file__).resolve().parent


def source_hash(root: Path = _PACKAGE) -> str:
    """SHA-256 over every .py and .yaml file under `root`, by relative path and content."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.suffix in (".py", ".yaml") and p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def git_output(*args: str, cwd: Path) -> str | None:
    """`git ARGS` run in `cwd`: its output stripped, or None (no git, not a checkout, an error)."""
    try:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


@functools.cache
def code_version() -> dict:
    """{"hasten", "source_sha256", "commit", "dirty"}; commit and dirty are None outside a checkout."""
    out = {"hasten": __version__, "source_sha256": source_hash(), "commit": None, "dirty": None}
    top = git_output("rev-parse", "--show-toplevel", cwd=_PACKAGE)
    if top and _PACKAGE.is_relative_to(Path(top).resolve()):
        out["commit"] = git_output("rev-parse", "HEAD", cwd=_PACKAGE)
        out["dirty"] = tree_dirty(_PACKAGE)
    return out


# The results record, data and reports: a measurement appends to it while it runs, so a change
# there is not a change of the code that measured.
RECORD_PATHS = ("benchmarks/results", "docs/results")


def tree_dirty(where: Path) -> bool | None:
    """Whether tracked files of the git checkout holding `where` differ from its commit, the
    results record (RECORD_PATHS) aside; None outside a checkout or where git cannot tell."""
    status = git_output("status", "--porcelain", "--untracked-files=no", "--", ":(top)",   # the whole checkout
                  *(f":(top,exclude){p}" for p in RECORD_PATHS), cwd=where)
    return bool(status) if status is not None else None


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


# ---------------------------------------------------------------------------- records
# The provenance every measurement record carries (hasten's bench runs, peer runs, benchmark
# results): which code, which machine, when it started, and for which comparison it was made.
# The results index lists the same fields; report sentences about run order are derived from
# them (`order_sentence`), never written by hand.
PROVENANCE_FIELDS = ("commit", "dirty", "machine", "started", "comparison", "order")


def machine_identity() -> dict:
    """The machine a figure holds for: CPU model and the flags that decide speed, cores, GPU."""
    gpu = None
    try:
        import torch
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except ImportError:
        pass
    return {"cpu": cpu_name(), "flags": cpu_features(), "kernel_caps": kernel_caps(), "cores": os.cpu_count(),
            "gpu": gpu}


def describe_machine(identity: dict) -> str:
    """One line for a machine_identity(): 'CPU (flags)[, kernels capped by ...], N cores[, GPU]'."""
    return (describe_cpu(identity.get("cpu"), identity.get("flags"), identity.get("kernel_caps"))
            + (f", {identity['cores']} cores" if identity.get("cores") else "")
            + (f", {identity['gpu']}" if identity.get("gpu") else ""))


def run_provenance(comparison: "str | None" = None, order: "int | None" = None, started: "str | None" = None) -> dict:
    """The PROVENANCE_FIELDS of a run starting now: `comparison` names the results folder it was
    made for (a record found in another folder was copied there); `order` its place among that
    comparison's runs (0-based), when the writer knows it."""
    code = code_version()
    return {"commit": code["commit"], "dirty": code["dirty"], "machine": machine_identity(),
            "started": started or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds"),
            "comparison": comparison, "order": order}


def _same_comparison(recorded: "str | None", folder: str) -> bool:
    """Whether a record's `comparison` names this comparison: its name, or its results folder's
    name (DATE-MACHINE-NAME, what `hasten bench --name` receives from a harness), either way round."""
    if recorded is None or recorded == folder:
        return True
    dated = r"\d{4}-\d{2}-\d{2}-[a-z0-9]+(?:-[a-z0-9]+)?-"
    return bool(re.fullmatch(dated + re.escape(folder), recorded) or re.fullmatch(dated + re.escape(recorded), folder))


def order_sentence(sides: "dict[str, list[dict]]", folder: str) -> str:
    """How the runs of a comparison were ordered, from their provenance alone: 'runs alternating',
    'the peer's runs first, then hasten's', or which side's runs were copied from another
    comparison (their `comparison` field names another folder) or carry no provenance. A record
    may name the comparison by its dated results folder (DATE-MACHINE-NAME); records naming two
    different such folders were made for two comparisons, and runs recorded on more than one
    machine are never called alternating.

    sides: label -> that side's records, each with a `provenance` dict (PROVENANCE_FIELDS)."""
    notes, timeline = [], []
    everything = [r.get("provenance") for records in sides.values() for r in records]
    dated = {p.get("comparison") for p in everything if p and p.get("comparison") not in (None, folder)}

    def here(recorded) -> bool:
        return recorded in (None, folder) or (len(dated) == 1 and _same_comparison(recorded, folder))
    machines = {json.dumps(p["machine"], sort_keys=True) for p in everything if p and p.get("machine")}
    for label, records in sides.items():
        provs = [r.get("provenance") for r in records]
        if not records:
            continue
        if any(p is None or not p.get("started") for p in provs):
            notes.append(f"{label}: {sum(p is None for p in provs)} of {len(records)} runs carry no start time or "
                         "commit (recorded before provenance was), so the order is unknown")
            continue
        copied = sorted({p["comparison"] for p in provs if not here(p.get("comparison"))})
        if copied:
            notes.append(f"{label}: {sum(not here(p.get('comparison')) for p in provs)} of {len(records)} "
                         f"runs copied from {', '.join(copied)} (not run beside the other side's)")
            continue
        timeline += [(p["started"], label) for p in provs]
    if len(machines) > 1:
        return (f"runs recorded on {len(machines)} different machines: not one comparison, and not alternating"
                + ("; " + "; ".join(notes) if notes else "") + ".")
    timeline.sort()
    labels = [label for _, label in timeline]
    counts = {x: labels.count(x) for x in dict.fromkeys(labels)}
    if len(counts) == 2:
        m = min(counts.values())
        head, tail = labels[:2 * m], labels[2 * m:]
        if all(a != b for a, b in zip(head, head[1:])) and len(set(tail)) <= 1:
            notes.insert(0, "runs alternating (by their recorded start times)"
                         + (f", {tail[0]}'s {len(tail)} further runs after" if tail else ""))
        elif sum(a != b for a, b in zip(labels, labels[1:])) == 1:
            notes.insert(0, f"{labels[0]}'s runs first, then {labels[-1]}'s (by their recorded start times)")
        else:
            notes.insert(0, f"runs in the order {', '.join(labels)} (by their recorded start times)")
    elif len(counts) > 2:
        notes.insert(0, f"runs in the order {', '.join(labels)} (by their recorded start times)")
    return "; ".join(notes) + "." if notes else "no runs."
