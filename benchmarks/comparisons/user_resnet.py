"""A user's own model and data, written as a user of plain PyTorch writes them: a small ResNet
and a 10,000-image CIFAR-10 subset whose crops and flips are drawn with `torch.rand` inside
`__getitem__`. Nothing here imports hasten but the CIFAR reader (a user has their own).

`recipes/user-resnet.yaml` names both, so `hasten train`, `hasten bench` and `hasten tune`
take this model as they take a packaged one; `vs_trainers resnet` trains the same model on
the same data in plain Lightning with bf16 and channels-last set by hand.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MEAN = torch.tensor([125.307, 122.961, 113.8575]).view(3, 1, 1) / 255
STD = torch.tensor([62.9932, 62.0887, 66.7048]).view(3, 1, 1) / 255


class Block(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut (a 1x1 convolution where the shape changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    """A ResNet for 32x32 images: a 3x3 stem, three stages (the second and third halve the size),
    `blocks` residual blocks a stage, global average pooling and a linear head."""

    def __init__(self, widths=(16, 32, 64), blocks: int = 2, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, c = [], widths[0]
        for i, w in enumerate(widths):
            for j in range(blocks):
                layers.append(Block(c, w, 2 if (i > 0 and j == 0) else 1))
                c = w
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(c, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Augmented(torch.utils.data.Dataset):
    """Training images with a random 4-pixel-padded crop and a random flip each, drawn with the
    global generator (what most user code does), normalised."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images = images.permute(0, 3, 1, 2).contiguous()   # (N, 3, 32, 32) uint8
        self.labels = labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = F.pad(self.images[i].float() / 255, (4, 4, 4, 4))
        dy, dx = (torch.rand(2) * 9).long().tolist()
        x = x[:, dy:dy + 32, dx:dx + 32]
        if torch.rand(()) < 0.5:
            x = x.flip(2)
        return (x - MEAN) / STD, self.labels[i]


def test_set(images: torch.Tensor, labels: torch.Tensor) -> torch.utils.data.TensorDataset:
    x = images.permute(0, 3, 1, 2).float() / 255
    return torch.utils.data.TensorDataset((x - MEAN) / STD, labels)


def loaders(path=None, subset: int = 10000, eval_subset: int = 10000):
    """(train, eval) datasets: the first `subset` training images of CIFAR-10 and the first
    `eval_subset` test images (`path`: an archive or folder; downloaded when None)."""
    from hasten.data.cifar import load_cifar10
    data = load_cifar10(path)
    return (Augmented(data.train_x[:subset], data.train_y[:subset]),
            test_set(data.test_x[:eval_subset], data.test_y[:eval_subset]))
