"""Ghost batch norm: batch-norm statistics over small chunks ("ghost batches") of the batch.

Normalising each chunk of `ghost_size` samples with its own mean and variance adds noise
that regularises like a small batch while the step keeps the large batch's throughput.
Running statistics are updated once per chunk, as if the chunks had been separate batches.
In eval mode it is plain batch norm.

Functional form: `ghost_batch_norm(x, bn, ghost_size)`. The Algorithm replaces every
BatchNorm1d/2d with a `GhostBatchNorm` holding the same parameters and buffers (at INIT, so
the optimizer sees them).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core import Algorithm
from ..registry import register_algorithm


def ghost_batch_norm(x: torch.Tensor, bn: nn.modules.batchnorm._BatchNorm, ghost_size: int) -> torch.Tensor:
    """Batch-norm `x` with `bn`'s parameters over chunks of `ghost_size` samples, each with its own
    statistics, updating `bn`'s running statistics once per chunk. In evaluation, or for a batch no
    larger than a chunk, it is `bn(x)`."""
    if not bn.training or x.shape[0] <= ghost_size:
        return bn(x)
    chunks = x.split(ghost_size)
    mom = bn.momentum if bn.momentum is not None else 0.1
    outs = [F.batch_norm(c, bn.running_mean, bn.running_var, bn.weight, bn.bias, True, mom, bn.eps) for c in chunks]
    if bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(len(chunks))
    return torch.cat(outs)


class GhostBatchNorm(nn.Module):
    """Wraps a batch-norm layer so that, while training, it normalises chunks of `ghost_size` samples
    separately (ghost_batch_norm); the wrapped layer keeps the running statistics."""
    def __init__(self, bn: nn.modules.batchnorm._BatchNorm, ghost_size: int):
        super().__init__()
        self.bn, self.ghost_size = bn, int(ghost_size)

    def forward(self, x):
        return ghost_batch_norm(x, self.bn, self.ghost_size)


def apply_ghost_batchnorm(model: nn.Module, ghost_size: int = 32) -> int:
    """In place: wrap every BatchNorm1d/2d of `model` in GhostBatchNorm(ghost_size). Returns the number
    wrapped."""
    count = 0
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if isinstance(child, (nn.BatchNorm1d, nn.BatchNorm2d)) and not isinstance(parent, GhostBatchNorm):
                setattr(parent, name, GhostBatchNorm(child, ghost_size))
                count += 1
    return count


@register_algorithm("ghost_batchnorm")
class GhostBatchNormAlgorithm(Algorithm):
    def __init__(self, ghost_size: int = 32):
        self.ghost_size = ghost_size

    def init(self, state, logger):
        if apply_ghost_batchnorm(state.model, self.ghost_size) == 0:
            raise ValueError("ghost_batchnorm: the model has no batch-norm layers; remove ghost_batchnorm from the "
                             "algorithms")


__all__ = ["ghost_batch_norm", "GhostBatchNorm", "apply_ghost_batchnorm", "GhostBatchNormAlgorithm"]
