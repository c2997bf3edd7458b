"""Max-pool reordering: pool right after the convolution, before batch norm and activation.

`conv -> BN -> act -> maxpool` and `conv -> maxpool -> BN -> act` compute the same function
when BN's per-channel affine map is non-decreasing (scale >= 0, eval mode) and the activation
is non-decreasing (ReLU, LeakyReLU, CELU, ELU), because max-pooling commutes with
per-channel non-decreasing maps. Pooling first makes BN and the activation run on a quarter
of the pixels (2x2 pooling). In training mode BN's batch statistics are then taken after
pooling, and for non-monotone activations (GELU, SiLU) the function changes slightly: a
small change of the model for a cheaper step.

Functional form: `reorder_pools(model)` rewrites every `nn.Sequential` containing the
pattern Conv2d, BatchNorm2d, activation, MaxPool2d. The Algorithm does it at INIT.
"""
from __future__ import annotations

import torch.nn as nn

from ..core import Algorithm

_ACTS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.CELU, nn.SiLU, nn.ELU, nn.Hardswish)


def reorder_pools(model: nn.Module) -> int:
    """Move MaxPool2d ahead of BN + activation in every Sequential; returns how many moved."""
    moved = 0
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        mods = list(seq)
        i = 0
        while i + 3 < len(mods):
            a, b, c, d = mods[i:i + 4]
            if (isinstance(a, nn.Conv2d) and isinstance(b, nn.BatchNorm2d) and isinstance(c, _ACTS)
                    and isinstance(d, nn.MaxPool2d)):
                mods[i:i + 4] = [a, d, b, c]
                moved += 1
                i += 4
            else:
                i += 1
        if moved:
            for j, m in enumerate(mods):
                seq._modules[str(j)] = m
    return moved


class PoolReorder(Algorithm):
    def init(self, state, logger):
        n = reorder_pools(state.model)
        logger.log({"pool_reorder/moved": n})
