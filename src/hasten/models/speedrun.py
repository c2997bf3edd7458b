"""A compact CIFAR speedrun network, written plainly.

    whitening stem   conv k x k (no padding) with 2 * C * k * k outputs, meant to be set
                     from data by `hasten.algorithms.patch_whitening` (PCA of image patches),
                     then `stem_act` (default: `act`; the Hive's record: GELU here, SiLU after)
    three groups     conv 3x3 -> max-pool 2 -> batch norm -> act -> conv 3x3 -> batch norm -> act
    head             global max-pool -> linear (no bias) -> logits times `logit_scale`;
                     `head_std` sets the head's initial weights to that standard deviation
                     (airbench's Muon variant: std 1 with logit_scale 1/256)

At the default widths (64, 256, 256) it is about 0.24 GFLOP per 32x32 image (a multiply-add
counted as 2); the `widths` knob scales it ((32, 96, 96): 0.048 GFLOP; (16, 48, 48): 0.016).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..registry import register_model

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "celu": nn.CELU, "silu": nn.SiLU}


def _act(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


class ConvGroup(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, act: str = "gelu", bn_momentum: float = 0.1, bn_eps: float = 1e-5):
        super().__init__(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.MaxPool2d(2),
            nn.BatchNorm2d(c_out, eps=bn_eps, momentum=bn_momentum), _act(act),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out, eps=bn_eps, momentum=bn_momentum), _act(act))


@register_model("speedrun")
class SpeedrunNet(nn.Module):
    def __init__(self, num_classes: int = 10, widths: tuple = (64, 256, 256), whiten_kernel: int = 2,
                 in_channels: int = 3, act: str = "gelu", logit_scale: float = 1 / 9,
                 bn_momentum: float = 0.1, bn_eps: float = 1e-5, head_std: float | None = None,
                 stem_act: str | None = None):
        super().__init__()
        if len(widths) != 3:
            raise ValueError(f"widths must have three entries (one per conv group), got {widths}")
        k = whiten_kernel
        stem = 2 * in_channels * k * k
        self.whiten = nn.Conv2d(in_channels, stem, k, padding=0, bias=True)
        self.stem_act = _act(stem_act or act)
        chans = (stem, *widths)
        self.groups = nn.Sequential(*(ConvGroup(chans[i], chans[i + 1], act, bn_momentum, bn_eps) for i in range(3)))
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.head = nn.Linear(widths[-1], num_classes, bias=False)
        self.logit_scale = logit_scale
        if head_std is not None:
            with torch.no_grad():
                self.head.weight.mul_(head_std / self.head.weight.std())

    def fsdp_blocks(self) -> list[nn.Module]:
        """The units sharded together under FSDP: the three conv groups (hasten.distributed.fsdp)."""
        return list(self.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.groups(self.stem_act(self.whiten(x)))
        return self.head(torch.flatten(self.pool(x), 1)) * self.logit_scale
