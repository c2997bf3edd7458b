"""Batch norm's running statistics held and put back around a pass whose update a method does
not want kept (selective backprop's training pass on the hardest samples, SAM's second pass at
the perturbed weights), and averaged over the last steps of a run (selective backprop's
`average_stats`). Public through `hasten.algorithms.selective_backprop`."""
from __future__ import annotations

import torch
import torch.distributed
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


def average_running_stats(before: list, steps_before: int, across_ranks: bool = True) -> None:
    """After one step in a window of steps whose batch statistics should be averaged: make every
    batch norm layer's running statistics the plain average of the batch statistics of
    `steps_before + 1` steps, the `steps_before` whose average the layer held when `before` was
    taken (`running_stats_of`, just before the step; 0 starts a new average) and this one.

    This step's statistics are read back from the layer's own update since `before` (torch's
    momentum rule, or the cumulative one where `momentum` is None), so nothing in the forward pass
    changes: no hook, and a compiled model sees the same buffers. A step of several forward passes
    (gradient accumulation) counts as one, its passes weighted as the momentum weighs them (equally
    where `momentum` is None). Under torch.distributed the ranks' averages are averaged, so every
    rank ends with the same statistics, those of every rank's samples (`across_ranks`)."""
    if not before:
        return
    with torch.no_grad():
        counts = torch.stack([torch.stack([n0, m.num_batches_tracked]) for m, (_, _, n0) in before]).tolist()
        changed = []
        for (m, (mean0, var0, _)), (old, now) in zip(before, counts):   # passes counted before and after the step
            p = now - old
            if p <= 0:
                continue   # the layer did not run in this step
            if m.momentum is None:   # cumulative average over num_batches_tracked passes
                this = [r + (r - s) * (old / p) for r, s in ((m.running_mean, mean0), (m.running_var, var0))]
            else:
                kept = (1.0 - m.momentum) ** p   # weight of the statistics before the step
                if kept >= 1.0:
                    continue   # momentum 0: the statistics never move
                this = [(r - kept * s) / (1.0 - kept) for r, s in ((m.running_mean, mean0), (m.running_var, var0))]
            for buf, start, new in zip((m.running_mean, m.running_var), (mean0, var0), this):
                buf.copy_(start + (new - start) / (steps_before + 1))
            changed += [m.running_mean, m.running_var]
        if across_ranks and changed and torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            flat = torch.cat([t.reshape(-1).float() for t in changed])
            torch.distributed.all_reduce(flat)
            flat /= torch.distributed.get_world_size()
            torch._foreach_copy_(changed, [v.view_as(t) for v, t in zip(flat.split([t.numel() for t in changed]), changed)])
