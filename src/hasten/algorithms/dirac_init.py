"""Dirac (identity) initialisation of convolutions.

The first min(in, out) filters of each stride-1, odd-kernel convolution become identity
maps (`torch.nn.init.dirac_`) scaled by `gain`; the remaining filters keep their random
initialisation. At the start of training every such conv passes its input through, so a
deep plain (non-residual) net starts close to a shallow one and trains at higher learning
rates from the first step.

Functional form: `dirac_init_(conv, gain)`. The Algorithm applies it at INIT to every
matching Conv2d (optionally only those whose names match `include` patterns).
"""
from __future__ import annotations

import fnmatch

import torch
import torch.nn as nn

from ..core import Algorithm
from ..registry import register_algorithm


@torch.no_grad()
def dirac_init_(conv: nn.Conv2d, gain: float = 1.0) -> nn.Conv2d:
    """In place: set the first min(in, out) filters of `conv` to the identity (a centred Dirac) times
    `gain`, so the layer starts by passing its input through; the remaining filters keep their
    values. Needs an ungrouped convolution with odd kernel sizes. Returns `conv`."""
    k = conv.kernel_size
    if conv.groups != 1 or k[0] % 2 == 0 or k[1] % 2 == 0:
        raise ValueError("Dirac init needs an ungrouped convolution with odd kernel sizes")
    n = min(conv.in_channels, conv.out_channels)
    ident = torch.empty(n, conv.in_channels, *k, dtype=conv.weight.dtype, device=conv.weight.device)
    nn.init.dirac_(ident)
    conv.weight[:n].copy_(ident * gain)
    return conv


@register_algorithm("dirac_init")
class DiracInit(Algorithm):
    def __init__(self, gain: float = 1.0, include: tuple = ("*",)):
        self.gain, self.include = gain, tuple(include)

    def init(self, state, logger):
        count = 0
        for name, m in state.model.named_modules():
            if (isinstance(m, nn.Conv2d) and m.groups == 1 and m.kernel_size[0] % 2 and m.kernel_size[1] % 2
                    and m.stride == (1, 1) and any(fnmatch.fnmatch(name, p) for p in self.include)):
                dirac_init_(m, self.gain)
                count += 1
        if count == 0:
            raise ValueError(f"dirac_init: the model has no ungrouped, stride-1 convolution with odd kernel sizes "
                             f"matching {list(self.include)}; remove dirac_init from the algorithms")


__all__ = ["dirac_init_", "DiracInit"]
