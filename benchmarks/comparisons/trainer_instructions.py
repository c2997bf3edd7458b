"""Trainer overhead in instructions: a count that does not drift with the machine.

`trainer_overhead.py` times the Trainer against the plain loop; on a shared 2-core machine
single runs of the same code spread by 2%, so a 1% change needs many runs to see. This
script counts the instructions a step executes instead (valgrind's callgrind, whose count
of the same work repeats to a few parts per million): each loop of `trainer_overhead.py`
(the plain loop, the Trainer bare, and with progress bar and JSONL logger) runs once for
`--steps A` and once for `--steps B` steps in a fresh process under callgrind, and the
difference divided by B - A is the instructions of one step, start-up and import cancelled.
`--src DIR` (repeatable) measures another checkout's `src` (e.g. a `git worktree` of an
older commit) beside this one, so two versions of the Trainer are compared by count.

Caveats: the count is of work, not of time (a cache miss or a slower instruction counts
one); the progress bar's refresh thread runs by the clock, and under callgrind (50x slower)
it runs more often per step than it would natively, so the bare Trainer is the cleaner
comparison. Needs valgrind (`apt install valgrind`); about two minutes a process.

    python -m benchmarks.comparisons.trainer_instructions [--steps 50,250] [--src DIR ...] [--jobs 2]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOOPS = ("plain", "hasten (no bar, no logger)", "hasten")


def child(loop: str, steps: int) -> None:
    """One loop for `steps` steps, after a 20-step warm-up of the same loop (first-call paths)."""
    import warnings

    import torch

    import trainer_overhead as T
    from hasten.allocator import configure_host_allocator

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    configure_host_allocator("auto", "cpu")

    with tempfile.TemporaryDirectory() as d:
        for n in (20, steps):
            if loop == "plain":
                T.plain(T.make_loader(n), n)
            else:
                T.hasten(T.make_loader(n), n, d, bare=loop != "hasten")


def count(src: Path, loop: str, steps: int) -> int:
    """Instructions callgrind counts for one child process."""
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/cg.out", sys.executable,
                            __file__, "--child", loop, str(steps)], env=env, capture_output=True, text=True)
    m = re.search(r"Collected\s*:\s*(\d+)", r.stderr)
    if r.returncode != 0 or not m:
        raise SystemExit(f"trainer_instructions: the {loop!r} loop from {src} failed under valgrind: "
                         f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    return int(m.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default="50,250", help="the two step counts, A,B (default 50,250)")
    p.add_argument("--src", action="append", default=[], help="another checkout's src folder to count beside this one")
    p.add_argument("--jobs", type=int, default=2, help="processes under valgrind at once (default 2)")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]))
    if shutil.which("valgrind") is None:
        raise SystemExit("trainer_instructions: valgrind is not installed; install it (apt install valgrind)")
    try:
        a, b = (int(x) for x in args.steps.split(","))
        assert 0 < a < b
    except (ValueError, AssertionError):
        raise SystemExit(f"trainer_instructions: --steps {args.steps!r}: give two step counts A,B with 0 < A < B") from None
    srcs = [HERE.parents[1] / "src"] + [Path(s).resolve() for s in args.src]
    for s in srcs:
        if not (s / "hasten" / "__init__.py").is_file():
            raise SystemExit(f"trainer_instructions: --src {s}: no hasten package there; give a checkout's src folder")
    jobs = [(s, loop, n) for s in srcs for loop in LOOPS for n in (a, b)]
    print(f"{len(jobs)} processes under callgrind, {args.jobs} at a time (about two minutes each)", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        counts = dict(zip(jobs, pool.map(lambda j: count(*j), jobs)))

    from benchmarks.tools.common import git_commit, tree_dirty, write_results

    def version(src: Path) -> str:
        return (git_commit(src) or str(src)) + (" (uncommitted changes)" if tree_dirty(src) else "")

    data, rows = {"steps": [a, b], "per_step": {}}, []
    for s in srcs:
        name = version(s)
        per = {loop: (counts[(s, loop, b)] - counts[(s, loop, a)]) / (b - a) for loop in LOOPS}
        data["per_step"][name] = {**per, "raw": {loop: [counts[(s, loop, a)], counts[(s, loop, b)]] for loop in LOOPS}}
        for loop in LOOPS:
            rows.append(f"| {name} | {loop} | {per[loop]:,.0f} | {per[loop] / per['plain']:.4f} | {per[loop] - per['plain']:+,.0f} |")
    md = ("# Trainer overhead in instructions (tiny MLP, batch 64, 1 thread, CPU, callgrind)\n\n"
          f"Instructions of one step: (count at {b} steps - count at {a} steps) / {b - a}, each a fresh process.\n\n"
          "| code | loop | instructions per step | ratio to the plain loop | over the plain loop |\n|---|---|---|---|---|\n"
          + "\n".join(rows))
    write_results("trainer_instructions", data, md)
    print(md)


if __name__ == "__main__":
    main()
