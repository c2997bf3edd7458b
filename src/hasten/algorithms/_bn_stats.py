"""Batch norm's running statistics held and put back around a pass whose update a method does
not want kept (selective backprop's training pass on the hardest samples, SAM's second pass at
the perturbed weights). Public through `hasten.algorithms.selective_backprop`."""
from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm


def running_stats_of(model: torch.nn.Module) -> list:
    """Copies of the running statistics (mean, variance, batch count) of every batch norm layer
    in `model` that tracks them, for `restore_running_stats`."""
    return [(m, [b.clone() for b in (m.running_mean, m.running_var, m.num_batches_tracked)])
            for m in model.modules()
            if isinstance(m, _BatchNorm) and m.track_running_stats and m.running_mean is not None]


def restore_running_stats(saved: list) -> None:
    """Put back the statistics `running_stats_of` copied, in place (the buffers stay the same tensors)."""
    with torch.no_grad():
        for m, values in saved:
            for b, v in zip((m.running_mean, m.running_var, m.num_batches_tracked), values):
                b.copy_(v)
