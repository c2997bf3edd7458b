"""Run benchmark comparisons: every run in its own process, seeds paired across recipes,
recipes interleaved (A B A B ...), results appended run by run so a stopped comparison
continues where it left off.

Each run ends in one of four outcomes, recorded as its `status`:
- finished: the worker trained to the end and wrote its result;
- capped: stopped by `--cap`; a censored run (it took at least its whole time);
- interrupted: stopped by a signal (to the worker or to `hasten bench`); never counted,
  rerun when the comparison is continued;
- failed: the worker exited with an error (its last log line is recorded); rerun when
  the comparison is continued.
Workers run in their own process session, so a terminal's Ctrl-C reaches `hasten bench`
alone; it then stops its worker (SIGTERM, then SIGKILL after a grace period), removes the
worker's temporary folder and raises `BenchInterrupted`.

A recipe spec is a recipe name or YAML path, optionally followed by overrides joined with
'+': `shakespeare-char-baseline+algorithms.delay.seconds=0.005+optimizer.lr=2e-3`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
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
    nproc: int = 1   # processes per run (data-parallel under torchrun when > 1)

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


COUNTED = ("finished", "capped")   # outcomes that enter the statistics and are not rerun
GRACE_S = 30.0                    # how long an interrupted worker gets to stop after SIGTERM


class BenchInterrupted(Exception):
    """`hasten bench` was stopped by a signal; its worker is stopped and cleaned up."""

    def __init__(self, signum: int, done: int, total: int):
        super().__init__(signum, done, total)
        self.signum, self.done, self.total = signum, done, total


def outcome(record: dict) -> str:
    """The record's outcome; records of older hasten versions said 'ok' for finished and
    interrupted alike, told apart here by the worker's stop reason."""
    status = record.get("status")
    if status == "ok":
        stop = (record.get("final") or {}).get("stop_reason")
        return "interrupted" if stop in ("sigterm", "sigint") else "finished"
    return status


def _stop_worker(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM to the worker's whole session, SIGKILL after `grace_s` (or at a second Ctrl-C);
    wait for it."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            continue
    proc.wait()


def _last_error(log: Path) -> str | None:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    errors = [ln for ln in lines if ln.startswith("hasten: error:") or "Error" in ln.split(":", 1)[0]]
    return (errors or lines or [None])[-1]


def run_one(spec: Spec, seed: int, out_dir: Path, cap_s: float | None = None) -> dict:
    """Train one (spec, seed) in a fresh process; returns its record. A KeyboardInterrupt
    while it runs stops the worker and comes back as a record with status 'interrupted'
    and the `interrupt` key set."""
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^\w.-]+", "_", spec.label)
    if len(safe) > 80:   # long labels share their first 80 characters: keep them apart
        safe = f"{safe[:70]}-{hashlib.sha1(spec.label.encode()).hexdigest()[:8]}"
    out = logs / f"{safe}-seed{seed}.jsonl"
    log_path = logs / f"{safe}-seed{seed}.log"
    if out.exists():
        out.unlink()
    interrupted = False
    with tempfile.TemporaryDirectory(prefix="hasten-bench-") as run_dir:
        spec_file = Path(run_dir) / "spec.json"
        spec_file.write_text(json.dumps({"recipe": spec.recipe, "overrides": spec.overrides, "seed": seed,
                                         "run_dir": str(Path(run_dir) / "run")}))
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={spec.nproc}"]
                      if spec.nproc > 1 else [sys.executable])   # data-parallel runs: the worker under torchrun
            proc = subprocess.Popen([*launch, "-m", "hasten.bench.worker", str(spec_file), str(out)],
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                rc = proc.wait(timeout=cap_s)
                status = "finished" if rc == 0 else "failed"
            except subprocess.TimeoutExpired:
                _stop_worker(proc, grace_s=0)
                status = "capped"
            except KeyboardInterrupt:
                _stop_worker(proc)
                status, interrupted = "interrupted", True
        wall = time.perf_counter() - t0
    evals, final, progress = _read_worker_output(out)
    if status == "finished" and final is None:
        status = "failed"
    if status == "finished" and final.get("stop_reason") in ("sigterm", "sigint"):
        status = "interrupted"   # the worker itself was stopped by a signal: it did not finish
    record = {"label": spec.label, "recipe": spec.recipe, "overrides": spec.overrides, "seed": seed,
              "status": status, "wall_s": wall, "evals": evals, "final": final, "progress": progress,
              "log": log_path.name}
    if status == "failed":
        record["error"] = _last_error(log_path)
    if interrupted:
        record["interrupt"] = True
    return record


def run_comparison(specs: list[Spec], seeds: list[int], out_dir: Path, cap_s: float | None = None,
                   console: Console | None = None) -> list[dict]:
    """Run every spec for every seed, interleaved, skipping runs that runs.jsonl already
    holds as finished or capped. Raises BenchInterrupted (after recording the stopped run
    as interrupted) when a KeyboardInterrupt arrives."""
    console = console or Console(stderr=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_file = out_dir / "runs.jsonl"
    _drop_torn_tail(runs_file)
    done = {(r["label"], r["seed"]) for r in load_runs(runs_file) if outcome(r) in COUNTED}
    todo = [(s, seed) for seed in seeds for s in specs if (s.label, seed) not in done]
    if done:
        console.print(f"continuing: {len(done)} runs already in {runs_file}, {len(todo)} to go")
    with Progress(TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console) as progress:
        task = progress.add_task("", total=len(todo))
        for i, (spec, seed) in enumerate(todo):
            progress.update(task, description=f"{spec.label} seed {seed}")
            record = run_one(spec, seed, out_dir, cap_s)
            with open(runs_file, "a") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
                os.fsync(f.fileno())
            if record.get("interrupt"):
                raise BenchInterrupted(signal.SIGINT, len(done) + i, len(done) + len(todo))
            if record["status"] == "failed":
                console.print(f"[red]run failed[/]: {spec.label} seed {seed}: {record.get('error')}; "
                              f"log: {out_dir / 'logs' / record['log']}")
            elif record["status"] == "interrupted":
                console.print(f"[yellow]run interrupted[/]: {spec.label} seed {seed} was stopped by a signal; "
                              "not counted, rerun when the comparison is continued")
            progress.advance(task)
    return [r for r in load_runs(runs_file) if r["label"] in {s.label for s in specs} and r["seed"] in seeds]
