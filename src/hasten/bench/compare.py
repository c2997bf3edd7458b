"""`hasten.bench.compare`: the harness for Trainers you build yourself.

    from hasten.bench import compare
    report = compare({"plain": lambda seed: Trainer(Net(), loader, seed=seed, ...),
                      "fast":  lambda seed: Trainer(Net(), loader, seed=seed, algorithms=[...], ...)},
                     seeds=3, target="val/acc>=@first-worst", out="bench-results/mine")

Each arm is a factory `f(seed) -> Trainer` (not yet fitted, with an evaluation set and the
metric the target names). Runs are interleaved (seed 0 of every arm, then seed 1, ...) and
written as they finish, so a stopped comparison continues where it stopped when called again
with the same arguments. The statistics and the report are `hasten bench`'s: time to target
(evaluation excluded), misses counted, Kaplan-Meier median ratios with bootstrap intervals,
final metrics with Welch's t.

Unlike `hasten bench`, whose every run has a fresh process, these runs share this process:
the first run pays one-time costs (library warm-up, kernel selection) that later runs do
not, which the interleaving spreads over the arms but does not remove. Where that matters,
give a recipe (`model: {name: my_pkg.models:Net}`) to `hasten bench` instead.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from .report import write_report
from .runner import COUNTED, read_worker_output, load_runs, outcome
from .target import Target
from .recording import timed_fit


def compare(arms: dict[str, Callable[[int], object]], seeds: int = 3, seed0: int = 0,
            target: str = "val/loss<=@first-worst", out: "str | Path" = "bench-results/compare",
            title: str = "hasten.bench.compare", quiet: bool = False) -> dict:
    """Time-to-quality comparison of Trainer factories (label -> f(seed) -> Trainer); returns
    the analysis `hasten bench` reports (also written to OUT/report.md, report.json, and
    report.png where matplotlib is installed). `target` as `hasten bench --target`, with the
    metric named (e.g. 'val/acc>=@first-worst': every run of the first arm reaches it)."""
    if not arms or not all(callable(f) for f in arms.values()):
        raise ConfigError("compare: give {label: factory} with each factory a function seed -> Trainer")
    if seeds < 1:
        raise ConfigError(f"compare: seeds={seeds}: give at least 1 run per arm")
    tgt = Target.parse(target)
    if not tgt.metric:
        raise ConfigError(f"compare: target {target!r} names no metric; write e.g. 'val/acc>=@first-worst'")
    out_dir = Path(out)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    runs_file = out_dir / "runs.jsonl"
    labels = list(arms)
    seed_list = [seed0 + i for i in range(seeds)]
    done = {(r["label"], r["seed"]) for r in load_runs(runs_file) if outcome(r) in COUNTED}
    for seed in seed_list:
        for label in labels:
            if (label, seed) in done:
                continue
            record = _run(label, arms[label], seed, out_dir)
            with open(runs_file, "a") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
                os.fsync(f.fileno())
            if not quiet:
                final = (record.get("final") or {}).get("metrics", {})
                print(f"compare: {label} seed {seed}: {record['status']}"
                      + (f", {tgt.metric}={final[tgt.metric]:.4f}" if tgt.metric in final else "")
                      + (f": {record['error']}" if record.get("error") else ""), flush=True)
            if record["status"] == "finished" and record["evals"] and tgt.metric not in record["evals"][0]["metrics"]:
                raise ConfigError(f"compare: the target's metric {tgt.metric!r} is not logged by {label} (its "
                                  f"evaluations log {sorted(record['evals'][0]['metrics'])}); give a target on one "
                                  "of those, or the metric to its Trainer")
    runs = [r for r in load_runs(runs_file) if r["label"] in arms and r["seed"] in seed_list]
    return write_report(runs, labels, tgt, out_dir, title, command=None)


def _run(label: str, factory, seed: int, out_dir: Path) -> dict:
    safe = re.sub(r"[^\w.-]+", "_", label)[:80]
    path = out_dir / "logs" / f"{safe}-seed{seed}.jsonl"
    if path.exists():
        path.unlink()
    t0 = time.perf_counter()
    status, error = "finished", None
    with open(path, "a") as out:
        try:
            trainer = factory(seed)
            if getattr(trainer, "state", None) is None or not hasattr(trainer, "fit"):
                raise ConfigError(f"compare: the factory of {label!r} returned a {type(trainer).__name__}, not a "
                                  "hasten Trainer")
            if trainer.state.eval_dataloader is None:
                raise ConfigError(f"compare: the Trainer of {label!r} has no eval_dataloader; time to target needs "
                                  "evaluations")
            timed_fit(trainer, out, t0, data_setup_s=time.perf_counter() - t0, close=trainer.close)
        except ConfigError:
            raise
        except Exception as e:   # a failed run is recorded and counted as failed, as hasten bench does
            status, error = "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    evals, final, progress = read_worker_output(path)
    if status == "finished" and final is None:
        status = "failed"
    record = {"label": label, "recipe": None, "overrides": [], "seed": seed, "status": status,
              "wall_s": time.perf_counter() - t0, "evals": evals, "final": final, "progress": progress,
              "log": path.name}
    if error:
        record["error"] = error
    return record
