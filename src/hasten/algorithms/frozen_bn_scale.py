"""Frozen batch-norm scale with a faster bias: BN weights fixed at a constant, BN biases at a
multiple of the learning rate.

With a BN scale fixed at `scale` (1 by default) the next layer's weights carry the scale
instead, one parameter set fewer to learn; the speedrun recipes pair it with a large
learning-rate multiplier on the BN biases (64 in airbench) so the shifts keep up.

Functional form: `freeze_bn_scale(model, scale, bias_lr_mult)` fixes the weights and tags
the biases with `lr_mult`, which `hasten.optim.param_groups` (and so every recipe's
optimizer) turns into a parameter group at that multiple of the learning rate. The
Algorithm does it at INIT, before the optimizer is built.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..core import Algorithm
from ..registry import register_algorithm


@torch.no_grad()
def freeze_bn_scale(model: nn.Module, scale: float = 1.0, bias_lr_mult: float = 1.0) -> int:
    """In place: fix every affine batch-norm scale of `model` at `scale` and stop its gradient; with
    `bias_lr_mult`, tag the biases with that learning-rate multiplier (hasten's param groups read
    it). Returns the number of layers frozen."""
    count = 0
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.affine:
            m.weight.fill_(scale)
            m.weight.requires_grad_(False)
            if bias_lr_mult != 1.0:
                m.bias.lr_mult = float(bias_lr_mult)
            count += 1
    return count


@register_algorithm("frozen_bn_scale")
class FrozenBNScale(Algorithm):
    def __init__(self, scale: float = 1.0, bias_lr_mult: float = 1.0):
        self.scale, self.bias_lr_mult = scale, bias_lr_mult

    def init(self, state, logger):
        if freeze_bn_scale(state.model, self.scale, self.bias_lr_mult) == 0:
            raise ValueError("FrozenBNScale: the model has no affine batch-norm layers")


__all__ = ["freeze_bn_scale", "FrozenBNScale"]
