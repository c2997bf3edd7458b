"""What a benchmark run records: evaluations and progress as they happen (BenchRecorder), and
a final record of times, counts, peak memory, the machine and the code (timed_fit). Shared by
`hasten bench`'s worker process and `hasten.bench.compare` (Trainer factories in Python)."""
from __future__ import annotations

import json
import os
import platform
import resource
import time

import torch

from ..allocator import host_allocator_state
from ..core import Callback
from ..hardware import cpu_features, cpu_name, kernel_caps
from ..provenance import code_version
from ..version import __version__


def _sync(state) -> None:
    sync = state.runtime.device_synchronize if state.runtime is not None else None
    if sync is not None:
        sync()


class BenchRecorder(Callback):
    """Times evaluations, the first (warm-up) batch and the steady state; writes evaluations."""

    def __init__(self, out):
        self.out = out
        self.eval_s = 0.0
        self.first_batch_s = None
        self._t_eval = None

    def _write(self, row):
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()

    def batch_end(self, state, logger):
        if self.first_batch_s is None:
            self.first_batch_s = state.timestamp.train_seconds
        if state.log_due:   # progress at log points: a run capped before its first evaluation still tells its speed
            ts = state.timestamp
            self._write({"kind": "progress", "train_s": ts.train_seconds, "batch": ts.batch, "sample": ts.sample,
                         "token": ts.token})

    def eval_start(self, state, logger):
        _sync(state)   # the Trainer ended the training segment the same way: this finds nothing queued
        self._t_eval = time.perf_counter()
        self._method_at_eval = state.method_seconds   # callbacks see an event after the algorithms

    def eval_end(self, state, logger):
        _sync(state)
        dt = time.perf_counter() - self._t_eval
        self.eval_s += dt
        ts = state.timestamp
        self._write({"kind": "eval", "train_s": ts.train_seconds, "batch": ts.batch, "sample": ts.sample,
                     "token": ts.token, "eval_s": dt, "metrics": dict(state.eval_metrics),
                     "method_setup_s": state.method_seconds,
                     # method time counted inside this evaluation (test-time augmentation's): already in
                     # method_setup_s, so in timed work, though it is evaluation time too
                     "eval_method_s": state.method_seconds - self._method_at_eval})

    def warmup_s(self, state) -> float:
        """Extra time of the first batch over the mean of the others (compile, allocator warm-up)."""
        ts = state.timestamp
        if self.first_batch_s is None or ts.batch < 2:
            return 0.0
        steady = (ts.train_seconds - self.first_batch_s) / (ts.batch - 1)
        return max(0.0, self.first_batch_s - steady)


def machine() -> dict:
    return {"cpu": cpu_name(), "cpu_features": cpu_features(), "kernel_caps": kernel_caps(),
            "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "hasten": __version__, "platform": platform.platform(),
            "host_allocator": host_allocator_state()}


def timed_fit(trainer, out, t0: float, data_setup_s: float, close=None) -> dict:
    """Fit `trainer` with a BenchRecorder writing to `out`, then write and return the final
    record (times, counts, peak memory, machine, code). `close` runs after fit, before the
    record (the run's own clean-up). What `hasten bench`'s worker and hasten.bench.compare share."""
    rec = BenchRecorder(out)
    state = trainer.state
    trainer.add_callbacks(rec)
    if state.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t1 = time.perf_counter()
    trainer.fit(summary=False)
    _sync(state)
    fit_wall = time.perf_counter() - t1
    if close is not None:
        close()
    ts = state.timestamp
    peak = (torch.cuda.max_memory_allocated() if state.device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    final = {
        "kind": "final", "metrics": dict(state.eval_metrics), "batch": ts.batch, "sample": ts.sample,
        "token": ts.token, "train_s": ts.train_seconds, "warmup_s": rec.warmup_s(state), "eval_s": rec.eval_s,
        "data_setup_s": data_setup_s, "method_setup_s": state.method_seconds,
        "fit_wall_s": fit_wall, "total_wall_s": time.perf_counter() - t0, "peak_memory_bytes": peak,
        "stop_reason": state.stop_reason, "device": str(state.device), "machine": machine(),
        "world_size": state.runtime.world.size, "compile_graphs_after_warmup": state.compile_graphs_after_warmup,
        "code": code_version()}
    out.write(json.dumps(final) + "\n")
    out.flush()
    return final
