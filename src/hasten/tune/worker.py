"""One `hasten tune` trial, in its own process (threads, the host allocator and compilation are
process-wide): build the recipe with the trial's overrides, train `steps` steps (at least
`min_seconds` of them after the warm-up), and write one JSON line: every step's duration and
training loss, the first step's extra time (compilation), or the reason it failed; with
`profile` in the spec, also where a profiled window's step time went, phase by phase.

    python -m hasten.tune.worker SPEC.json OUT.json
"""
from __future__ import annotations

import json
import sys
import time
import traceback

import torch

from ..build import build_run
from ..callbacks.profile import Profile
from ..config import load_recipe
from ..core import Callback
from ..distributed.world import leave_worker
from ..errors import HastenError, first_line
from ..models import has_batch_norm


class StepTimes(Callback):
    """Each step's wall time (batch end to batch end) and loss; stops the run when enough."""

    def __init__(self, warmup: int, steps: int, min_seconds: float, max_steps: int):
        self.warmup, self.steps, self.min_seconds, self.max_steps = warmup, steps, min_seconds, max_steps
        self.times, self.losses, self.samples = [], [], []
        self._last = None

    def fit_start(self, state, logger):
        self._last = time.perf_counter()

    def batch_end(self, state, logger):
        sync = state.runtime.device_synchronize
        if sync is not None:
            sync()
        now = time.perf_counter()
        self.times.append(now - self._last)
        self._last = now
        loss = state.step_losses[-1] if state.step_losses else None
        self.losses.append(float(loss) if loss is not None else None)
        self.samples.append(int(state.batch[0].shape[0]) if isinstance(state.batch, (list, tuple)) else None)
        measured = self.times[self.warmup:]
        if len(self.times) >= self.max_steps or (len(measured) >= self.steps and sum(measured) >= self.min_seconds):
            state.stop_training = True


def main(spec_path: str, out_path: str) -> int:
    spec = json.loads(open(spec_path).read())
    result = {"label": spec["label"], "round": spec.get("round"), "status": "ok"}
    try:
        recipe = load_recipe(spec["recipe"], list(spec["overrides"]) + [
            f"trainer.run_dir={spec['run_dir']}", "trainer.progress_bar=false", "trainer.tensorboard=false",
            "trainer.checkpoints=false", f"trainer.seed={spec.get('seed', 0)}",
            f"trainer.max_duration={spec['max_steps'] + 1}ba", "trainer.log_interval=1000000ba"])
        run = build_run(recipe, progress_bar=False, console_logger=False)
        run.trainer.eval_dataloader = None   # throughput only: no evaluation in a trial
        timer = StepTimes(spec["warmup"], spec["steps"], spec["min_seconds"], spec["max_steps"])
        run.trainer.add_callbacks(timer)
        profile = None
        if spec.get("profile"):   # a profiled window after the warm-up: where each step's time goes
            profile = Profile(steps=spec["profile"], warmup=spec["warmup"], print_table=False)
            run.trainer.add_callbacks(profile)
        t0 = time.perf_counter()
        run.trainer.fit(summary=False)
        run.close(discard=False)
        result.update(times=timer.times, losses=timer.losses, samples=timer.samples, wall_s=time.perf_counter() - t0,
                      precision=run.trainer.state.precision, threads=torch.get_num_threads(),
                      batch=recipe.data.batch_size, microbatch=run.trainer.state.microbatch,
                      steps_per_epoch=run.trainer.state.steps_per_epoch,
                      batch_norm=has_batch_norm(run.trainer.state.model), data_wait=run.trainer.state.data_wait,
                      tokens_per_step=(ts.token / ts.batch) if (ts := run.trainer.state.timestamp).batch else None)
        if profile is not None and profile.result is not None:
            r = profile.result
            result["profile"] = {"steps": r["steps"], "step_ms": 1000 * r["step_s"],
                                 "ms": {k: 1000 * v / r["steps"] for k, v in r["seconds"].items()}}
    except torch.OutOfMemoryError as e:
        result.update(status="out of memory", reason=first_line(e))
    except HastenError as e:
        result.update(status="refused", reason=first_line(e))
    except Exception as e:   # a trial that crashes is a miss, with its reason
        result.update(status="failed", reason=f"{type(e).__name__}: {first_line(e)}",
                      traceback=traceback.format_exc()[-2000:])
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1], sys.argv[2])
    leave_worker(code)
    sys.exit(code)
