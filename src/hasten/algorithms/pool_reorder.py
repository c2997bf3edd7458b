"""Max-pool reordering: pool right after the convolution, before batch norm and activation.

`conv -> BN -> act -> maxpool` and `conv -> maxpool -> BN -> act` compute the same function
when BN's per-channel affine map is non-decreasing (scale >= 0, eval mode) and the activation
is non-decreasing (ReLU, LeakyReLU, CELU, ELU), because max-pooling commutes with
per-channel non-decreasing maps. Pooling first makes BN and the activation run on a quarter
of the pixels (2x2 pooling). In training mode BN's batch statistics are then taken after
pooling, and for non-monotone activations (GELU, SiLU) the function changes slightly: a
small change of the model for a cheaper step.

Functional form: `reorder_pools(model)` rewrites the pattern Conv2d, BatchNorm2d, activation,
MaxPool2d wherever it sits in one `nn.Sequential`, and where a Sequential ends in Conv2d,
BatchNorm2d, activation and the max-pool follows it in the enclosing Sequential (ResNet-9's
`Sequential(conv_bn(...), MaxPool2d(2), ...)`): the pool moves into the inner block and an
`nn.Identity` keeps its place, so the parameter names of the other modules stay as they were.
The Algorithm does it at INIT and refuses a model with no such pattern (it would do nothing).
"""
from __future__ import annotations

import torch.nn as nn

from ..core import Algorithm
from ..registry import register_algorithm

_ACTS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.CELU, nn.SiLU, nn.ELU, nn.Hardswish)


def _ends_in_conv_bn_act(mods: list) -> bool:
    return (len(mods) >= 3 and isinstance(mods[-3], nn.Conv2d) and isinstance(mods[-2], nn.BatchNorm2d)
            and isinstance(mods[-1], _ACTS))


def _renumber(seq: nn.Sequential, mods: list) -> None:
    seq._modules.clear()
    for j, m in enumerate(mods):
        seq._modules[str(j)] = m


def reorder_pools(model: nn.Module) -> int:
    """Move MaxPool2d ahead of BN + activation; returns how many pools moved."""
    moved = 0
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        mods, n_before = list(seq), moved
        i = 0
        while i + 3 < len(mods):   # conv, BN, act, pool side by side in this Sequential
            if _ends_in_conv_bn_act(mods[i:i + 3]) and isinstance(mods[i + 3], nn.MaxPool2d):
                mods[i:i + 4] = [mods[i], mods[i + 3], mods[i + 1], mods[i + 2]]
                moved += 1
                i += 4
            else:
                i += 1
        for i in range(len(mods) - 1):   # a block ending in conv, BN, act, then the pool beside it
            inner, pool = mods[i], mods[i + 1]
            if isinstance(inner, nn.Sequential) and isinstance(pool, nn.MaxPool2d) and _ends_in_conv_bn_act(list(inner)):
                body = list(inner)
                _renumber(inner, body[:-2] + [pool] + body[-2:])
                mods[i + 1] = nn.Identity()
                moved += 1
        if moved > n_before:
            _renumber(seq, mods)
    return moved


@register_algorithm("pool_reorder")
class PoolReorder(Algorithm):
    def init(self, state, logger):
        n = reorder_pools(state.model)
        if n == 0:
            raise ValueError("pool_reorder: the model has no conv -> BatchNorm -> activation -> max-pool pattern "
                             "(its pools may already come first); remove pool_reorder from the algorithms")
        logger.log({"pool_reorder/moved": n})


__all__ = ["reorder_pools", "PoolReorder"]
