"""Channels-last: store 4-D activations and convolution weights as (N, H, W, C) in memory.

oneDNN (CPU) and cuDNN (GPU) convolution kernels are faster in this layout, most of all in
reduced precision. Functional form: `apply_channels_last(model)` converts the weights; the
Algorithm does that at INIT and converts each 4-D input batch that is not channels-last
already (a DeviceLoader can produce channels-last batches itself, which is cheaper).
"""
from __future__ import annotations

import torch

from ..core import Algorithm
from ..registry import register_algorithm


def apply_channels_last(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with its 4-D parameters and buffers in channels-last memory format (in place; returned
    for chaining). Inputs must be converted too (to_channels_last)."""
    return model.to(memory_format=torch.channels_last)


def to_channels_last(x):
    if isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point():
        return x.contiguous(memory_format=torch.channels_last)
    return x


@register_algorithm("channels_last")
class ChannelsLast(Algorithm):
    def fsdp_refusal(self):
        return ("FSDP2 (torch 2.13) does not shard non-contiguous parameters, and channels-last conv kernels are "
                "that; drop channels_last under parallelism=fsdp (or use ddp)")

    def init(self, state, logger):
        if not any(isinstance(m, torch.nn.Conv2d) for m in state.model.modules()):
            raise ValueError("channels_last: the model has no 2-D convolutions, the only layers the memory format "
                             "changes; remove channels_last from the algorithms")
        apply_channels_last(state.model)

    def after_dataloader(self, state, logger):
        b = state.batch
        if isinstance(b, (tuple, list)) and b:
            state.batch = type(b)([to_channels_last(b[0]), *b[1:]]) if isinstance(b, list) else (to_channels_last(b[0]), *b[1:])
        elif isinstance(b, torch.Tensor):
            state.batch = to_channels_last(b)


__all__ = ["apply_channels_last", "ChannelsLast"]
