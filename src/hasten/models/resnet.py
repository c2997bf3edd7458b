"""Residual networks for small images, written plainly (no torchvision).

`ResNet9`: the DAWNBench CIFAR-10 network (prep conv, then three groups, the first and
third with a residual block), with a width knob. At width 64 it is the original
(about 0.76 GFLOP per 32x32 image, counting a multiply-add as 2); at width 40 about 0.30.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..registry import register_model


def conv_bn(c_in: int, c_out: int, act=nn.ReLU) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), act())


class Residual(nn.Module):
    def __init__(self, c: int, act=nn.ReLU):
        super().__init__()
        self.body = nn.Sequential(conv_bn(c, c, act), conv_bn(c, c, act))

    def forward(self, x):
        return x + self.body(x)


@register_model("resnet9")
class ResNet9(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 64, act=nn.ReLU):
        super().__init__()
        w = (width, 2 * width, 4 * width, 8 * width)
        self.prep = conv_bn(3, w[0], act)
        self.layer1 = nn.Sequential(conv_bn(w[0], w[1], act), nn.MaxPool2d(2), Residual(w[1], act))
        self.layer2 = nn.Sequential(conv_bn(w[1], w[2], act), nn.MaxPool2d(2))
        self.layer3 = nn.Sequential(conv_bn(w[2], w[3], act), nn.MaxPool2d(2), Residual(w[3], act))
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.fc = nn.Linear(w[3], num_classes, bias=False)

    def fsdp_blocks(self) -> list[nn.Module]:
        """The units sharded together under FSDP: the three layers (hasten.distributed.fsdp)."""
        return [self.layer1, self.layer2, self.layer3]

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.prep(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


# ---------------------------------------------------------------------------- ResNet-18 / ResNet-50
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, c_in: int, c: int, stride: int = 1):
        super().__init__()
        self.branch = nn.Sequential(
            nn.Conv2d(c_in, c, 3, stride, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
            nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))
        self.shortcut = _shortcut(c_in, c, stride)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.shortcut(x) + self.branch(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, c_in: int, c: int, stride: int = 1):
        super().__init__()
        out = c * 4
        self.branch = nn.Sequential(
            nn.Conv2d(c_in, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
            nn.Conv2d(c, c, 3, stride, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
            nn.Conv2d(c, out, 1, bias=False), nn.BatchNorm2d(out))
        self.shortcut = _shortcut(c_in, out, stride)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.shortcut(x) + self.branch(x))


def _shortcut(c_in: int, c_out: int, stride: int) -> nn.Module:
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))


class ResNet(nn.Module):
    """ResNet (He et al., 2016) with a CIFAR stem (3x3 conv, no pooling; for 32x32 images)
    or an ImageNet stem (7x7 stride-2 conv and a 3x3 stride-2 max-pool). The last BN of each
    residual branch starts at zero when `zero_init_residual` (each block starts as identity)."""

    def __init__(self, block, layers, num_classes: int = 1000, stem: str = "imagenet", width: int = 64,
                 zero_init_residual: bool = True):
        super().__init__()
        if stem not in ("imagenet", "cifar"):
            raise ValueError(f"stem={stem!r}: use 'imagenet' or 'cifar'")
        if stem == "imagenet":
            self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        else:
            self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(inplace=True))
        stages, c_in = [], width
        for i, n in enumerate(layers):
            c = width * 2 ** i
            blocks = []
            for j in range(n):
                blocks.append(block(c_in, c, 2 if (j == 0 and i > 0) else 1))
                c_in = c * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, (BasicBlock, Bottleneck)):
                    nn.init.zeros_(m.branch[-1].weight)

    def fsdp_blocks(self) -> list[nn.Module]:
        """The units sharded together under FSDP: the residual blocks of every stage (hasten.distributed.fsdp)."""
        return [block for stage in self.stages for block in stage]

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


@register_model("resnet18")
def resnet18(num_classes: int = 1000, stem: str = "imagenet", width: int = 64,
             zero_init_residual: bool = True) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, stem, width, zero_init_residual)


@register_model("resnet50")
def resnet50(num_classes: int = 1000, stem: str = "imagenet", width: int = 64,
             zero_init_residual: bool = True) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, stem, width, zero_init_residual)
