"""CPU inference cost of a model: latency at batch 1 and throughput at larger batches, each
path (eager and compiled) measured, interleaved with the model it is compared against.

    rows = inference_cost({"fp32": dense, "int8": small}, make_input, batches=[1, 64, 2000])

Every row is the median over `repeats` timed calls; the calls of all models and paths
alternate (model A, model B, model A, ...) so a change in the machine's load falls on all
alike. Compilation (inductor, with `freezing`, which int8 kernels need to be fast) happens
before timing and its cost is reported apart. `best` picks the faster path per model and batch.
`Autocast(model)` is the same model run under CPU bf16 autocast: on a CPU with bf16 hardware
that is the float path a user would otherwise deploy, so a compressed model is also compared
with it, not only with fp32.
"""
from __future__ import annotations

import statistics
import time
import warnings
from typing import Callable

import torch

from ..data.batches import forward
from ..errors import first_line


def _compiled(model):
    import torch._inductor.config as ic
    compiled = torch.compile(model, dynamic=False)

    def run(x):
        with ic.patch(freezing=True):
            return compiled(x)
    return run


@torch.inference_mode()
def inference_cost(models: dict, make_input: Callable[[int], torch.Tensor], batches: list[int],
                   repeats: int = 7, paths: tuple[str, ...] = ("eager", "compiled"), progress=None) -> list[dict]:
    """Rows {model, path, batch, median_s, per_item_ms, items_per_s, compile_s, runs}."""
    rows = []
    for b in batches:
        torch._dynamo.reset()   # one batch size at a time: no recompilation limits, no dynamic shapes
        x = make_input(b)
        runners = {}
        for name, model in models.items():
            model.eval()
            for path in paths:
                t0 = time.perf_counter()
                f = model if path == "eager" else _compiled(model)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        forward(f, x)
                        forward(f, x)   # warm-up (and compilation)
                except Exception as e:   # a path that cannot run this model is reported, not fatal
                    rows.append({"model": name, "path": path, "batch": b, "error": f"{type(e).__name__}: {first_line(e)[:160]}"})
                    continue
                runners[(name, path)] = (f, time.perf_counter() - t0)
        times = {k: [] for k in runners}
        for _ in range(repeats):
            for k, (f, _) in runners.items():
                t = time.perf_counter()
                forward(f, x)
                times[k].append(time.perf_counter() - t)
            if progress:
                progress()
        for (name, path), ts in times.items():
            med = statistics.median(ts)
            rows.append({"model": name, "path": path, "batch": b, "median_s": med, "per_item_ms": 1e3 * med / b,
                         "items_per_s": b / med, "compile_s": runners[(name, path)][1] if path != "eager" else 0.0,
                         "runs": len(ts)})
    return rows


class Autocast(torch.nn.Module):
    """`model` run under CPU autocast to `dtype` (bf16): its convolutions and matrix products in
    bf16, its parameters untouched; what `precision: bf16-mixed` evaluates with."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, *args, **kwargs):
        with torch.autocast("cpu", dtype=self.dtype):
            return self.model(*args, **kwargs)


def best(rows: list[dict]) -> dict:
    """(model, batch) -> the fastest path's row."""
    out = {}
    for r in rows:
        if "median_s" not in r:
            continue
        key = (r["model"], r["batch"])
        if key not in out or r["median_s"] < out[key]["median_s"]:
            out[key] = r
    return out


__all__ = ["Autocast", "best", "inference_cost"]
