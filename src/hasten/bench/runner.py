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
from rich.progress import MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..callbacks.progress import work_progress
from ..config import load_recipe, to_dict
from ..errors import ConfigError, brief
from ..outputs import Outputs
from ..processes import spawn, stop
from ..provenance import code_version, describe_machine, machine_identity, run_provenance
from ..provenance import describe as describe_code

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


def read_worker_output(path: Path) -> tuple[list[dict], dict | None, dict | None]:
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


def _last_error(log: Path) -> str | None:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    errors = [ln for ln in lines if ln.startswith("hasten: error:") or "Error" in ln.split(":", 1)[0]]
    return (errors or lines or [None])[-1]


BENCH_FILES = ("runs.jsonl", "report.md", "report.json", "report.png", "ladder.md", "ladder.json", "ladder.png")
BENCH_HINT = "give --name for a new comparison (or --out for another folder), or move them away"


def log_names(spec: Spec, seed: int) -> tuple[str, str]:
    """The worker's output and the log of one run, relative to the comparison's folder."""
    safe = re.sub(r"[^\w.-]+", "_", spec.label)
    if len(safe) > 80:   # long labels share their first 80 characters: keep them apart
        safe = f"{safe[:70]}-{hashlib.sha1(spec.label.encode()).hexdigest()[:8]}"
    return f"logs/{safe}-seed{seed}.jsonl", f"logs/{safe}-seed{seed}.log"


def planned_files(specs: list[Spec], seeds: list[int]) -> tuple[str, ...]:
    """Every file a comparison of these specs and seeds may write in its folder."""
    return BENCH_FILES + tuple(n for s in specs for seed in seeds for n in log_names(s, seed))


def _bench_folder(folder: Path) -> bool:
    """A comparison folder from before the output index: its runs.jsonl holds bench records."""
    return _runs_file(folder / "runs.jsonl")


def _runs_file(path: Path) -> bool:
    """A runs.jsonl of bench records (a last line cut short by a kill included)."""
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError):
        return False
    try:
        records = [json.loads(ln) for ln in lines[:-1]]   # the last line may be torn
    except ValueError:
        return False
    return bool(lines) and all(isinstance(r, dict) and {"label", "seed", "status"} <= set(r) for r in records)


def bench_outputs(out_dir: Path) -> Outputs:
    """The files `hasten bench` writes in a comparison's folder, under hasten's rule for output folders."""
    return Outputs(out_dir, "hasten bench", legacy=_bench_folder, appended={"runs.jsonl": _runs_file})


def run_one(spec: Spec, seed: int, out_dir: Path, cap_s: float | None = None, keep: Path | None = None) -> dict:
    """Train one (spec, seed) in a fresh process; returns its record. A KeyboardInterrupt
    while it runs stops the worker and comes back as a record with status 'interrupted'
    and the `interrupt` key set. With `keep`, the run's folder is `keep/LABEL-seedN` and
    its final checkpoint stays there (what `trainer.load_path` reads); otherwise nothing is
    written but the record and the log."""
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    names = log_names(spec, seed)
    out, log_path = out_dir / names[0], out_dir / names[1]
    outputs = bench_outputs(out_dir)
    outputs.claim(names)   # checked before the comparison started (check_earlier_runs)
    safe = Path(names[0]).stem.removesuffix(f"-seed{seed}")
    if out.exists():
        out.unlink()
    interrupted = False
    with tempfile.TemporaryDirectory(prefix="hasten-bench-") as run_dir:
        spec_file = Path(run_dir) / "spec.json"
        kept = keep / f"{safe}-seed{seed}" if keep is not None else None
        spec_file.write_text(json.dumps({"recipe": spec.recipe, "overrides": spec.overrides, "seed": seed,
                                         "run_dir": str(kept or Path(run_dir) / "run"), "keep": kept is not None}))
        t0, provenance = time.perf_counter(), run_provenance(comparison=out_dir.name)
        with open(log_path, "w") as log:
            launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={spec.nproc}"]
                      if spec.nproc > 1 else [sys.executable])   # data-parallel runs: the worker under torchrun
            proc = spawn([*launch, "-m", "hasten.bench.worker", str(spec_file), str(out)],
                         stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                rc = proc.wait(timeout=cap_s)
                status = "finished" if rc == 0 else "failed"
            except subprocess.TimeoutExpired:
                stop(proc, grace_s=0)
                status = "capped"
            except KeyboardInterrupt:
                stop(proc, GRACE_S)
                status, interrupted = "interrupted", True
        wall = time.perf_counter() - t0
    outputs.record(names)
    evals, final, progress = read_worker_output(out)
    if status == "finished" and final is None:
        status = "failed"
    if status == "finished" and final.get("stop_reason") in ("sigterm", "sigint"):
        status = "interrupted"   # the worker itself was stopped by a signal: it did not finish
    record = {"label": spec.label, "recipe": spec.recipe, "overrides": spec.overrides, "seed": seed,
              "status": status, "wall_s": wall, "evals": evals, "final": final, "progress": progress,
              "log": log_path.name, "provenance": provenance}
    if status == "failed":
        record["error"] = _last_error(log_path)
    if interrupted:
        record["interrupt"] = True
    if kept is not None and status == "finished":
        record["run_dir"] = str(kept)
    return record


def run_identity(spec: Spec, cap_s: float | None) -> dict:
    """What defines a run besides its seed: the recipe as its overrides resolve it, and the
    harness's options (time cap, processes)."""
    try:
        recipe = to_dict(load_recipe(spec.recipe, spec.overrides))
    except ConfigError:   # a recipe that does not load (its run will fail and say why): the spec as given
        return {"spec": {"recipe": spec.recipe, "overrides": list(spec.overrides)}, "cap_s": cap_s, "nproc": spec.nproc}
    recipe["trainer"] = {k: v for k, v in recipe["trainer"].items() if k != "seed"}
    return {"recipe": recipe, "cap_s": cap_s, "nproc": spec.nproc}


def differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """'key: old -> new' for every setting both nested dicts hold and hold differently (a key
    one of them lacks is a setting a later hasten added with its default: not a difference)."""
    out = []
    for k in sorted(set(a) & set(b), key=str):
        x, y = a[k], b[k]
        if isinstance(x, dict) and isinstance(y, dict):
            out += differences(x, y, f"{prefix}{k}.")
        elif x != y:
            out.append(f"{prefix}{k}: {brief(x, 40)} -> {brief(y, 40)}")
    return out


def _check_same_runs(earlier: list[dict], identity: dict, runs_file: Path, console) -> None:
    """Runs already in the file count only if they were made with the same settings on the same
    kind of machine (provenance.machine_identity): any other counted run of the same label is
    refused in one line naming the difference. Runs recorded
    before hasten kept settings are taken as they are (said once); runs of other code are
    said once (long comparisons continue across commits)."""
    legacy, other_code, here = 0, set(), code_version()
    this_machine = machine_identity()
    for r in earlier:
        if outcome(r) not in COUNTED:
            continue
        theirs = (r.get("provenance") or {}).get("machine")
        # each field whole (kernel caps {} against {ISA: AVX2} differ); fields a record lacks do not count
        if theirs and any(theirs[k] != this_machine[k] for k in theirs.keys() & this_machine.keys()):
            raise ConfigError(f"{runs_file} holds runs made on another machine ({describe_machine(theirs)}; this is "
                              f"{describe_machine(this_machine)}): times from two machines do not make one speedup; "
                              "give --name for a new comparison on this machine")
        if r.get("identity") is None:
            legacy += 1
        elif differences(r["identity"], identity[r["label"]]):
            diff = differences(r["identity"], identity[r["label"]])
            raise ConfigError(f"{runs_file} holds runs of {r['label']} made with other settings "
                              f"({'; '.join(diff[:3])}{'; ...' if len(diff) > 3 else ''}); give --name for a new "
                              "comparison, or the settings those runs had")
        code = (r.get("final") or {}).get("code")
        if code and code.get("commit") != here.get("commit"):
            other_code.add(describe_code(code))
    if legacy:
        console.print(f"note: {legacy} run(s) in {runs_file} were recorded before hasten kept their settings; "
                      "they are counted as made with these")
    if other_code:
        console.print(f"note: runs in {runs_file} were made by other code ({'; '.join(sorted(other_code))[:200]}); "
                      f"this is {describe_code(here)}")


def check_earlier_runs(specs: list[Spec], seeds: list[int], out_dir: Path, cap_s: float | None,
                       console) -> tuple[list[dict], dict]:
    """(the runs already in out_dir that this comparison continues, each spec's identity); a
    ConfigError when runs of the same label were made with other settings. Writes nothing."""
    runs_file = out_dir / "runs.jsonl"
    bench_outputs(out_dir).check(planned_files(specs, seeds), BENCH_HINT)
    _drop_torn_tail(runs_file)
    identity = {s.label: run_identity(s, cap_s) for s in specs}
    earlier = [r for r in load_runs(runs_file) if r["label"] in identity and r["seed"] in seeds]
    _check_same_runs(earlier, identity, runs_file, console)
    return earlier, identity


def run_comparison(specs: list[Spec], seeds: list[int], out_dir: Path, cap_s: float | None = None,
                   console: Console | None = None, metric: str | None = None, keep: Path | None = None) -> list[dict]:
    """Run every spec for every seed, interleaved, skipping runs that runs.jsonl already
    holds as finished or capped; with `keep`, each run's final checkpoint stays in its own
    folder under it (run_one). Raises BenchInterrupted (after recording the stopped run
    as interrupted) when a KeyboardInterrupt arrives, and a ConfigError after the first
    evaluation of a run that does not log `metric` (the target's)."""
    console = console or Console(stderr=True)
    earlier, identity = check_earlier_runs(specs, seeds, out_dir, cap_s, console)
    outputs = bench_outputs(out_dir)
    outputs.adopt(planned_files(specs, seeds))
    outputs.lock("bench results folder")   # one bench at a time in a comparison's folder
    try:
        runs_file = out_dir / "runs.jsonl"
        done = {(r["label"], r["seed"]) for r in earlier if outcome(r) in COUNTED}
        todo = [(s, seed) for seed in seeds for s in specs if (s.label, seed) not in done]
        if done:
            console.print(f"continuing: {len(done)} runs already in {runs_file}, {len(todo)} to go")
        with work_progress("bench", console, MofNCompleteColumn(), TextColumn("{task.description}"),
                           TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()) as progress:
            task = progress.add_task("", total=len(todo))
            for i, (spec, seed) in enumerate(todo):
                progress.update(task, description=f"{spec.label} seed {seed}")
                record = run_one(spec, seed, out_dir, cap_s, keep)
                record["identity"] = identity[spec.label]
                outputs.claim(["runs.jsonl"])
                with open(runs_file, "a") as f:
                    f.write(json.dumps(record) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                outputs.record(["runs.jsonl"])
                if record.get("interrupt"):
                    raise BenchInterrupted(signal.SIGINT, len(done) + i, len(done) + len(todo))
                logged = set((record["evals"] or [{}])[0].get("metrics", {})) if record.get("evals") else None
                if metric and logged is not None and metric not in logged:
                    raise ConfigError(f"the target's metric {metric!r} is not logged by {spec.label} (its evaluations log "
                                      f"{sorted(logged)}); give --target on one of those")
                if record["status"] == "failed":
                    console.print(f"[red]run failed[/]: {spec.label} seed {seed}: {record.get('error')}; "
                                  f"log: {out_dir / 'logs' / record['log']}")
                elif record["status"] == "interrupted":
                    console.print(f"[yellow]run interrupted[/]: {spec.label} seed {seed} was stopped by a signal; "
                                  "not counted, rerun when the comparison is continued")
                progress.advance(task)
        return [r for r in load_runs(runs_file) if r["label"] in identity and r["seed"] in seeds
                and not differences(r.get("identity") or {}, identity[r["label"]])]
    finally:
        outputs.unlock()
