"""ImageNet-style image folders: `root/<split>/<class>/<image>` with per-sample seeded transforms.

`ImageFolder(root, split)` lists the images (classes are the sorted sub-folder names) and
decodes them with Pillow in the DataLoader's workers. Transforms follow the standard
ImageNet recipe and take their randomness from the generator TransformDataset gives them
(seeded by seed, epoch and index), so augmentation is reproducible and resumes exactly:

- `RandomResizedCrop(size)`: a crop of 8% to 100% of the area with aspect ratio in
  [3/4, 4/3], resized to size x size, flipped left-right with probability 1/2;
- `ResizeCenterCrop(resize, size)`: shorter side to `resize`, then the central size x size.
Both return normalised float CHW tensors.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .download import DatasetNotFoundError

IMAGENET_MEAN = (123.675, 116.28, 103.53)   # 0..255 units
IMAGENET_STD = (58.395, 57.12, 57.375)
EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def _pil():
    try:
        from PIL import Image
    except ImportError as e:
        raise ImportError("image folders need Pillow: pip install 'hasten[vision]'") from e
    return Image


class ImageFolder(Dataset):
    def __init__(self, root: "str | os.PathLike", split: str = "train", classes: list[str] | None = None):
        folder = Path(root).expanduser() / split
        if not folder.is_dir():
            raise DatasetNotFoundError(f"no image folder at {folder}: expected {Path(root)}/{split}/<class>/<image>")
        self.classes = classes or sorted(d.name for d in folder.iterdir() if d.is_dir())
        if not self.classes:
            raise DatasetNotFoundError(f"{folder} has no class sub-folders")
        index = {c: i for i, c in enumerate(self.classes)}
        self.samples = [(str(p), index[c]) for c in self.classes if (folder / c).is_dir()
                        for p in sorted((folder / c).iterdir()) if p.suffix.lower() in EXTENSIONS]
        if not self.samples:
            raise DatasetNotFoundError(f"{folder} holds no images ({', '.join(EXTENSIONS)})")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        with _pil().open(path) as img:
            return img.convert("RGB"), label


def _to_tensor(img, mean, std) -> torch.Tensor:
    x = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1).float()
    return (x - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)


class RandomResizedCrop:
    def __init__(self, size: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip: bool = True,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD):
        self.size, self.scale, self.ratio, self.flip, self.mean, self.std = size, scale, ratio, flip, mean, std

    def box(self, w: int, h: int, g: torch.Generator) -> tuple[int, int, int, int]:
        area = w * h
        log_r = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            u = torch.rand(4, generator=g).tolist()
            target = area * (self.scale[0] + u[0] * (self.scale[1] - self.scale[0]))
            aspect = math.exp(log_r[0] + u[1] * (log_r[1] - log_r[0]))
            cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < cw <= w and 0 < ch <= h:
                left, top = int(u[2] * (w - cw + 1)), int(u[3] * (h - ch + 1))
                return left, top, left + cw, top + ch
        side = min(w, h)   # fallback: the central square
        return (w - side) // 2, (h - side) // 2, (w + side) // 2, (h + side) // 2

    def __call__(self, img, g: torch.Generator) -> torch.Tensor:
        Image = _pil()
        img = img.resize((self.size, self.size), Image.BILINEAR, box=self.box(*img.size, g))
        if self.flip and torch.rand(1, generator=g).item() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return _to_tensor(img, self.mean, self.std)


class ResizeCenterCrop:
    def __init__(self, resize: int, size: int, mean=IMAGENET_MEAN, std=IMAGENET_STD):
        self.resize, self.size, self.mean, self.std = resize, size, mean, std

    def __call__(self, img, g: torch.Generator | None = None) -> torch.Tensor:
        Image = _pil()
        w, h = img.size
        s = self.resize / min(w, h)
        img = img.resize((max(self.size, round(w * s)), max(self.size, round(h * s))), Image.BILINEAR)
        w, h = img.size
        left, top = (w - self.size) // 2, (h - self.size) // 2
        return _to_tensor(img.crop((left, top, left + self.size, top + self.size)), self.mean, self.std)
