"""One benchmark run, in its own process: build the recipe, train, record timings.

    python -m hasten.bench.worker SPEC.json OUT.jsonl

SPEC holds {recipe, overrides, seed}. OUT receives one JSON line per evaluation as it
happens (so a run stopped by the time cap keeps its history), one per log point with the
training time and samples so far (so a capped run tells its speed even before its first
evaluation), and a final line with the totals (hasten.bench.recording): data set-up, warm-up,
training, evaluation and method set-up seconds, samples, tokens, peak memory, a description
of the machine and the code that ran (commit and whether the tree was dirty, or the version
and a hash of the package's source). Nothing in the package imports this module: it runs as
a script, and the package's own import of it would make Python warn about running it twice.
"""
from __future__ import annotations

import json
import os
import sys
import time

from ..build import build_run
from ..config import load_recipe
from ..distributed.world import leave_worker
from ..errors import HastenError
from .recording import timed_fit


def main(spec_path: str, out_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    overrides = list(spec.get("overrides", [])) + [
        f"trainer.seed={spec['seed']}", f"trainer.run_dir={spec['run_dir']}", "trainer.progress_bar=false",
        "trainer.tensorboard=false"]
    # --keep-checkpoints: the final checkpoint only (written after the clock stops); otherwise none
    overrides += ["trainer.save_interval=1dur", "trainer.keep_last=1"] if spec.get("keep") else ["trainer.checkpoints=false"]
    t0 = time.perf_counter()
    recipe = load_recipe(spec["recipe"], overrides)
    main_rank = int(os.environ.get("RANK", "0")) == 0   # under torchrun (bench --nproc) rank 0 alone records
    with open(out_path if main_rank else os.devnull, "a") as out:
        run = build_run(recipe, progress_bar=False, console_logger=False)
        data_setup_s = time.perf_counter() - t0
        timed_fit(run.trainer, out, t0, data_setup_s, close=run.close)
    return 0


def _main_with_errors(argv: list[str]) -> int:
    """main(), with hasten's own errors as one line (the runner records the last line)."""
    try:
        return main(argv[1], argv[2])
    except HastenError as e:
        print(f"hasten: error: {e}", flush=True)
        return 2


if __name__ == "__main__":
    _code = _main_with_errors(sys.argv)
    leave_worker(_code)   # a torchrun worker exits here, its work done
    sys.exit(_code)
