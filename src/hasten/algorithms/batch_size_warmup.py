"""Batch-size warm-up: small batches first, the full batch later.

Functional form: `take_batch(batch, n)` keeps the first n samples of every tensor in a
batch. Early in training the gradient noise scale is small, so small batches make about
as much progress per sample at a fraction of the cost (McCandlish et al., 2018; GPT-3
used a batch-size ramp). The Algorithm grows the batch linearly from `start_fraction` of
the loader's batch to all of it over `duration`, in multiples of `multiple`. Under data
parallelism the global batch grows so: each rank keeps its share of the step's samples.
"""
from __future__ import annotations

import torch

from ..core import Algorithm, Time
from ..data.batches import batch_size, share_range
from ..registry import register_algorithm


def take_batch(batch, n: int):
    """The first `n` samples of a batch: a tensor, or a list, tuple or dict of them (other values as
    they are)."""
    if isinstance(batch, torch.Tensor):
        return batch[:n]
    if isinstance(batch, (list, tuple)):
        return type(batch)(take_batch(b, n) for b in batch)
    if isinstance(batch, dict):
        return {k: take_batch(v, n) for k, v in batch.items()}
    return batch


@register_algorithm("batch_size_warmup")
class BatchSizeWarmup(Algorithm):
    def __init__(self, start_fraction: float = 0.25, duration: str = "0.2dur", multiple: int = 1):
        if not 0 < start_fraction <= 1:
            raise ValueError("start_fraction must lie in (0, 1]")
        self.start_fraction, self.duration, self.multiple = start_fraction, Time.parse(duration), max(1, multiple)

    def after_dataloader(self, state, logger):
        p = state.progress_through(self.duration)
        if p >= 1.0:
            return
        world = getattr(state.runtime, "world", None)
        parallel = world is not None and world.size > 1
        full = state.global_batch_size if parallel else batch_size(state.batch)
        frac = self.start_fraction + (1 - self.start_fraction) * p
        n = max(self.multiple, int(full * frac) // self.multiple * self.multiple)
        if n >= full:
            return
        if parallel:   # n samples in all: each rank keeps its share of n, from the front of its share
            start, stop = share_range(n, world.rank, world.size)
            state.batch, state.global_batch_size = take_batch(state.batch, stop - start), n
        else:
            state.batch = take_batch(state.batch, n)


__all__ = ["take_batch", "BatchSizeWarmup"]
