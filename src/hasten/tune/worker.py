"""One `hasten tune` trial, in its own process (threads, the host allocator and compilation are
process-wide): build the recipe with the trial's overrides, train `steps` steps (at least
`min_seconds` of them after the warm-up), and write one JSON line: every step's duration and
training loss, the first step's extra time (compilation), or the reason it failed; with
`profile` in the spec, also where a profiled window's step time went, phase by phase.

    python -m hasten.tune.worker SPEC.json OUT.json
"""
from __future__ import annotations

import json
import os
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


def model_facts(model, loader) -> dict:
    """What the built run is, for the search's stages (decided from this, never from the task's
    name): 2-D convolutions, batch norm, an embedding table, the model's and the loader's kinds."""
    from torch import nn
    modules = list(model.modules())
    return {"conv2d": any(isinstance(m, nn.Conv2d) for m in modules), "batch_norm": has_batch_norm(model),
            "embedding": any(isinstance(m, nn.Embedding) for m in modules), "model": type(model).__name__,
            "loader": type(loader).__name__, "device_loader": type(loader).__name__ == "DeviceLoader"}


def _cpu_ticks() -> "tuple[int, int, int] | None":
    """(every core's busy ticks, this process tree's ticks, its descendants' ticks) now, from
    /proc (Linux); None elsewhere. The descendants are the loader's worker processes; a worker
    that ended and was reaped still counts, through its parent's tally of reaped children
    (cutime, cstime), so a loader that restarts its workers each epoch is not taken for another
    process on the cores."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)   # less idle and iowait
        me, mine, workers = os.getpid(), 0, 0
        for pid in _tree(me):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parts = f.read().rsplit(")", 1)[1].split()
            except OSError:   # a worker that ended since the listing
                continue
            own, reaped = int(parts[11]) + int(parts[12]), int(parts[13]) + int(parts[14])   # utime+stime, cutime+cstime
            mine += own + reaped
            workers += reaped + (own if pid != me else 0)
        return busy, mine, workers
    except (OSError, ValueError, IndexError):
        return None


def _tree(root: int) -> list[int]:
    """`root` and its descendants (the trial and its loader workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


class StepTimes(Callback):
    """Each step's wall time (batch end to batch end) and loss; stops the run when enough."""

    def __init__(self, warmup: int, steps: int, min_seconds: float, max_steps: int):
        self.warmup, self.steps, self.min_seconds, self.max_steps = warmup, steps, min_seconds, max_steps
        self.times, self.losses, self.samples = [], [], []
        self._last = None

    def fit_start(self, state, logger):
        self._last = time.perf_counter()
        self._ticks = self._wall = None
        self.others_share = None   # other processes' share of the cores while the measured steps ran
        self.loader_cores = None   # the cores the loader's worker processes kept busy meanwhile

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
        if len(self.times) == self.warmup:   # the measured window starts: the cores' use from here
            self._ticks, self._wall = _cpu_ticks(), now
        if len(self.times) >= self.max_steps or (len(measured) >= self.steps and sum(measured) >= self.min_seconds):
            state.stop_training = True
            end = _cpu_ticks()
            if self._ticks is not None and end is not None and now > self._wall:
                hz, cores = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
                others = (end[0] - self._ticks[0]) - (end[1] - self._ticks[1])
                self.others_share = max(0.0, others / hz / ((now - self._wall) * cores))
                self.loader_cores = max(0, end[2] - self._ticks[2]) / hz / (now - self._wall)


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
                      facts=model_facts(run.trainer.state.model, run.trainer.state.train_dataloader),
                      others_share=timer.others_share, loader_cores=timer.loader_cores,
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
