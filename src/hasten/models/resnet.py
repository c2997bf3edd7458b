"""Residual networks for small images, written plainly (no torchvision).

`ResNet9`: the DAWNBench CIFAR-10 network (prep conv, then three groups, the first and
third with a residual block), with a width knob. At width 64 it is the original
(about 0.76 GFLOP per 32x32 image, counting a multiply-add as 2); at width 40 about 0.30.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def conv_bn(c_in: int, c_out: int, act=nn.ReLU) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), act())


class Residual(nn.Module):
    def __init__(self, c: int, act=nn.ReLU):
        super().__init__()
        self.body = nn.Sequential(conv_bn(c, c, act), conv_bn(c, c, act))

    def forward(self, x):
        return x + self.body(x)


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

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.prep(x))))
        return self.fc(torch.flatten(self.pool(x), 1))
