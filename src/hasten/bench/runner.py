"""Run benchmark comparisons: every run in its own process, seeds paired across recipes,
recipes interleaved (A B A B ...), results appended run by run so a stopped comparison
continues where it left off.

A recipe spec is a recipe name or YAML path, optionally followed by overrides joined with
'+': `shakespeare-char-baseline+algorithms.delay.seconds=0.005+optimizer.lr=2e-3`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

_SPLIT = re.compile(r"\+(?=[A-Za-z_][\w.]*=)")


@dataclass
class Spec:
    label: str
    recipe: str
    overrides: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str, shared: list[str] = (), last: list[str] = ()) -> "Spec":
        """`shared` overrides come first (the recipe's own '+' overrides win over them);
        `last` ones come after everything (they win: the harness's evaluation cadence)."""
        recipe, *extra = _SPLIT.split(text)
        name = Path(recipe).stem if recipe.endswith((".yaml", ".yml")) else recipe
        return cls(label="+".join([name] + extra), recipe=recipe, overrides=list(shared) + extra + list(last))


def unique_labels(specs: list[Spec]) -> list[Spec]:
    seen: dict[str, int] = {}
    for s in specs:
        n = seen.get(s.label, 0)
        seen[s.label] = n + 1
        if n:
            s.label = f"{s.label} #{n + 1}"
    return specs


def load_runs(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    runs = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                runs.append(json.loads(line))
            except json.JSONDecodeError:
                pass   # a torn last line from a killed bench: that run is redone
    return runs


def _drop_torn_tail(path: Path) -> None:
    """A bench killed while appending leaves a partial last line: cut it so the next
    record starts on a line of its own (that run is then redone)."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def _read_worker_output(path: Path) -> tuple[list[dict], dict | None, dict | None]:
    """(evaluations, the final record or None, the last progress record or None)."""
    evals, final, progress = [], None, None
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = row.get("kind")
            if kind == "eval":
                evals.append(row)
            elif kind == "final":
                final = row
            elif kind == "progress":
                progress = row
    return evals, final, progress


def run_one(spec: Spec, seed: int, out_dir: Path, cap_s: float | None = None) -> dict:
    """Train one (spec, seed) in a fresh process; returns its record."""
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^\w.-]+", "_", spec.label)
    if len(safe) > 80:   # long labels share their first 80 characters: keep them apart
        safe = f"{safe[:70]}-{hashlib.sha1(spec.label.encode()).hexdigest()[:8]}"
    out = logs / f"{safe}-seed{seed}.jsonl"
    if out.exists():
        out.unlink()
    with tempfile.TemporaryDirectory(prefix="hasten-bench-") as run_dir:
        spec_file = Path(run_dir) / "spec.json"
        spec_file.write_text(json.dumps({"recipe": spec.recipe, "overrides": spec.overrides, "seed": seed,
                                         "run_dir": str(Path(run_dir) / "run")}))
        t0 = time.perf_counter()
        with open(logs / f"{safe}-seed{seed}.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "hasten.bench.worker", str(spec_file), str(out)],
                                    stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                rc = proc.wait(timeout=cap_s)
                status = "ok" if rc == 0 else "failed"
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                status = "capped"
        wall = time.perf_counter() - t0
    evals, final, progress = _read_worker_output(out)
    if status == "ok" and final is None:
        status = "failed"
    return {"label": spec.label, "recipe": spec.recipe, "overrides": spec.overrides, "seed": seed,
            "status": status, "wall_s": wall, "evals": evals, "final": final, "progress": progress,
            "log": str((logs / f"{safe}-seed{seed}.log").name)}


def run_comparison(specs: list[Spec], seeds: list[int], out_dir: Path, cap_s: float | None = None,
                   console: Console | None = None) -> list[dict]:
    """Run every spec for every seed, interleaved, skipping what runs.jsonl already holds."""
    console = console or Console(stderr=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_file = out_dir / "runs.jsonl"
    _drop_torn_tail(runs_file)
    done = {(r["label"], r["seed"]) for r in load_runs(runs_file) if r.get("status") in ("ok", "capped")}
    todo = [(s, seed) for seed in seeds for s in specs if (s.label, seed) not in done]
    if done:
        console.print(f"continuing: {len(done)} runs already in {runs_file}, {len(todo)} to go")
    with Progress(TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console) as progress:
        task = progress.add_task("", total=len(todo))
        for spec, seed in todo:
            progress.update(task, description=f"{spec.label} seed {seed}")
            record = run_one(spec, seed, out_dir, cap_s)
            with open(runs_file, "a") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
                os.fsync(f.fileno())
            if record["status"] == "failed":
                console.print(f"[red]run failed[/]: {spec.label} seed {seed}; see {out_dir / 'logs' / record['log']}")
            progress.advance(task)
    return [r for r in load_runs(runs_file) if r["label"] in {s.label for s in specs} and r["seed"] in seeds]
