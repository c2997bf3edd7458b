"""Count forward FLOPs of convolutions and linear layers with hooks (2 per multiply-add)."""
from __future__ import annotations

import torch
import torch.nn as nn


def forward_flops(model: nn.Module, example: torch.Tensor) -> int:
    """FLOPs of one forward pass of `example` (all of its batch), counting conv and linear layers."""
    total = 0

    def hook(m, inp, out):
        nonlocal total
        if isinstance(m, nn.Conv2d):
            k = m.kernel_size[0] * m.kernel_size[1] * (m.in_channels // m.groups)
            total += 2 * out.numel() * k
        elif isinstance(m, nn.Linear):
            total += 2 * out.numel() * m.in_features

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        was = model.training
        model.eval()
        with torch.no_grad():
            model(example)
        model.train(was)
    finally:
        for h in handles:
            h.remove()
    return total


def training_flops_per_sample(model: nn.Module, example: torch.Tensor) -> float:
    """Forward plus backward (about 3x forward) per sample."""
    return 3.0 * forward_flops(model, example) / example.shape[0]
