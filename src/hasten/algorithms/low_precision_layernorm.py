"""Low-precision layer norm: run LayerNorm in the autocast dtype instead of float32.

Under autocast, PyTorch computes `layer_norm` in float32 (its autocast policy upcasts it),
which means a cast in, a float32 kernel and a float32 output that the next matmul casts
back. `LPLayerNorm` runs the kernel on bf16/fp16 inputs, weights and bias directly (the
kernel still accumulates its statistics in float32), so the activations stay in the low
precision. Outside autocast it is exactly `nn.LayerNorm`.

Functional form: `low_precision_layer_norm(x, normalized_shape, weight, bias, eps)`. The
Algorithm swaps every `nn.LayerNorm` for an `LPLayerNorm` holding the same parameters, at
INIT (before the optimizer is built).
"""
from __future__ import annotations

import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core import Algorithm
from ..registry import register_algorithm


def _autocast_dtype(device_type: str):
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def low_precision_layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """F.layer_norm computed in the active autocast dtype (inputs, weight and bias cast to it); without
    autocast it is plain F.layer_norm."""
    dtype = _autocast_dtype(x.device.type)
    if dtype is None:
        return F.layer_norm(x, normalized_shape, weight, bias, eps)
    cast = (lambda t: t.to(dtype) if t is not None else None)
    with torch.autocast(x.device.type, enabled=False):
        return F.layer_norm(cast(x), normalized_shape, cast(weight), cast(bias), eps)


class LPLayerNorm(nn.LayerNorm):
    """nn.LayerNorm that, under autocast, normalises in the autocast dtype (bf16/fp16) instead of
    float32."""
    def forward(self, x):
        return low_precision_layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


def apply_low_precision_layernorm(model: nn.Module) -> int:
    """In place: turn every nn.LayerNorm of `model` into an LPLayerNorm (weights kept). Returns the
    number changed."""
    count = 0
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if type(child) is nn.LayerNorm:
                new = LPLayerNorm(child.normalized_shape, child.eps, child.elementwise_affine,
                                  bias=child.bias is not None, device=child.weight.device if child.weight is not None else None)
                if child.elementwise_affine:
                    new.weight = child.weight
                    if child.bias is not None:
                        new.bias = child.bias
                setattr(parent, name, new)
                count += 1
    return count


@register_algorithm("low_precision_layernorm")
class LowPrecisionLayerNorm(Algorithm):
    def init(self, state, logger):
        if apply_low_precision_layernorm(state.model) == 0:
            raise ValueError("low-precision layer norm: the model has no nn.LayerNorm modules")
        if not str(state.precision).endswith("-mixed"):
            warnings.warn(f"low_precision_layernorm acts only under mixed precision (bf16-mixed, fp16-mixed); at "
                          f"precision {state.precision} it changes nothing", stacklevel=2)


__all__ = ["low_precision_layer_norm", "LPLayerNorm", "apply_low_precision_layernorm", "LowPrecisionLayerNorm"]
