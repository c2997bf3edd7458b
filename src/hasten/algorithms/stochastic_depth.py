"""Stochastic depth: drop whole residual branches at random while training (Huang et al., 2016).

Each residual branch `f` in `x + f(x)` is wrapped so that, in training, each sample keeps
it with probability `1 - p` (scaled by `1 / (1 - p)`, so the expectation is unchanged) and
otherwise passes through the shortcut alone; in evaluation the branch is always used. The
drop rate grows linearly with depth up to `drop_rate` at the last block. Dropped branches
still cost compute in this sample-wise form; the gain is regularisation, which lets deep
nets train shorter or at higher learning rates.

Functional form: `drop_path(y, p, generator)`. The Algorithm wraps, at INIT, the branch
attribute (`branch` in hasten's ResNets, `body` in ResNet-9) of every residual block.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..core import Algorithm
from ..registry import register_algorithm


def drop_path(y: torch.Tensor, p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Zero each sample's `y` (along the first dimension) with probability `p` and scale the kept ones
    by 1 / (1 - p), so the expectation is unchanged; p <= 0 returns `y`."""
    if p <= 0.0:
        return y
    if p >= 1.0:
        raise ValueError(f"drop_path: p must lie below 1 (the kept samples are scaled by 1 / (1 - p)), got {p}")
    keep = torch.rand((y.shape[0],) + (1,) * (y.dim() - 1), device=y.device, generator=generator) >= p
    return y * keep.to(y.dtype) / (1.0 - p)


class DropPath(nn.Module):
    """Wraps a residual `branch`: while training, its output is dropped for each sample with
    probability `p` (and scaled by 1 / (1 - p)); in evaluation it passes as it is."""
    def __init__(self, branch: nn.Module, p: float):
        super().__init__()
        self.branch, self.p = branch, float(p)

    def forward(self, x):
        y = self.branch(x)
        return drop_path(y, self.p) if self.training else y


@register_algorithm("stochastic_depth")
class StochasticDepth(Algorithm):
    def __init__(self, drop_rate: float = 0.1, branch_names: tuple = ("branch", "body")):
        if not 0.0 <= drop_rate < 1.0:
            raise ValueError(f"drop_rate must lie in [0, 1), got {drop_rate}")
        self.drop_rate, self.branch_names = drop_rate, tuple(branch_names)

    def init(self, state, logger):
        blocks = [(m, n) for m in state.model.modules() for n in self.branch_names
                  if isinstance(getattr(m, n, None), nn.Module) and not isinstance(getattr(m, n), DropPath)
                  and not isinstance(m, DropPath)]
        if not blocks:
            raise ValueError(f"stochastic depth: no residual blocks with a branch named {self.branch_names}")
        for i, (m, n) in enumerate(blocks, start=1):
            setattr(m, n, DropPath(getattr(m, n), self.drop_rate * i / len(blocks)))


__all__ = ["drop_path", "DropPath", "StochasticDepth"]
