"""BlurPool: anti-aliased downsampling (Zhang, 2019).

Strided convolutions and max-pools alias: a one-pixel shift of the input can change the
output a lot. BlurPool low-passes before subsampling: a max-pool of stride s becomes a
stride-1 max-pool followed by a fixed [1, 2, 1] x [1, 2, 1] / 16 blur with stride s; a
strided conv becomes a blur (stride 1) followed by the conv. The blur is a depthwise conv
with reflect padding and no parameters to learn.

Functional form: `blur2d(x, stride)` and `apply_blurpool(model, convs=True, maxpools=True)`
(returns how many layers it changed). The Algorithm does the surgery at INIT.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core import Algorithm
from ..registry import register_algorithm

_KERNEL = torch.tensor([1.0, 2.0, 1.0])


def blur2d(x: torch.Tensor, stride: int = 1) -> torch.Tensor:
    """Blur each channel of `x` (N, C, H, W) with the normalised [1 2 1] outer-product kernel (reflect
    padding), keeping every `stride`-th pixel."""
    c = x.shape[1]
    k = torch.outer(_KERNEL, _KERNEL).to(x.dtype).to(x.device) / 16.0
    w = k.expand(c, 1, 3, 3)
    return F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), w, stride=stride, groups=c)


class BlurPool2d(nn.Module):
    """A [1 2 1] x [1 2 1] blur per channel subsampled by `stride` (blur2d as a module)."""
    def __init__(self, stride: int = 2):
        super().__init__()
        self.stride = stride

    def forward(self, x):
        return blur2d(x, self.stride)


class BlurMaxPool2d(nn.Module):
    """A max-pool of `kernel_size` at stride 1, then a [1 2 1] blur subsampled by `stride`: the anti-
    aliased drop-in for nn.MaxPool2d(kernel_size, stride)."""
    def __init__(self, kernel_size, stride):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size, stride=1, padding=(kernel_size - 1) // 2 if kernel_size % 2 else 0)
        self.stride = stride

    def forward(self, x):
        return blur2d(self.pool(x), self.stride)


class BlurConv2d(nn.Module):
    """Blur, then the original (strided) convolution: its weights are kept."""
    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.conv = conv

    def forward(self, x):
        return self.conv(blur2d(x, 1))


def apply_blurpool(model: nn.Module, convs: bool = True, maxpools: bool = True, min_channels: int = 16) -> int:
    """In place: blur before every strided convolution with at least `min_channels` input channels
    (`convs`) and replace every strided max-pool with BlurMaxPool2d (`maxpools`). Returns the number
    of layers changed."""
    count = 0
    for parent in list(model.modules()):
        if isinstance(parent, (BlurConv2d, BlurMaxPool2d)):
            continue
        for name, child in list(parent.named_children()):
            if maxpools and isinstance(child, nn.MaxPool2d):
                k = child.kernel_size if isinstance(child.kernel_size, int) else child.kernel_size[0]
                s = child.stride if isinstance(child.stride, int) else child.stride[0]
                if s > 1:
                    setattr(parent, name, BlurMaxPool2d(k, s))
                    count += 1
            elif (convs and isinstance(child, nn.Conv2d) and max(child.stride) > 1
                  and child.in_channels >= min_channels):
                setattr(parent, name, BlurConv2d(child))
                count += 1
    return count


@register_algorithm("blurpool")
class BlurPool(Algorithm):
    def __init__(self, convs: bool = True, maxpools: bool = True, min_channels: int = 16):
        self.convs, self.maxpools, self.min_channels = convs, maxpools, min_channels

    def init(self, state, logger):
        if apply_blurpool(state.model, self.convs, self.maxpools, self.min_channels) == 0:
            raise ValueError(f"blurpool: the model has no strided convolution or max-pool with at least "
                             f"{self.min_channels} channels to blur; remove blurpool from the algorithms")


__all__ = ["blur2d", "BlurPool2d", "BlurMaxPool2d", "BlurConv2d", "apply_blurpool", "BlurPool"]
