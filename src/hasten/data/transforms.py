"""Per-sample image transforms for host DataLoaders, driven by an explicit generator
(see TransformDataset): the same sample gets the same augmentation in every run."""
from __future__ import annotations

import torch
import torch.nn.functional as F


class Normalize:
    """uint8 HWC -> float CHW, (x - mean) / std with mean and std in 0..255 units."""

    def __init__(self, mean, std):
        self.mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)

    def __call__(self, x: torch.Tensor, g: torch.Generator | None = None) -> torch.Tensor:
        # contiguous CHW: padding a permuted (channels-last) view is about 100x slower on a CPU
        return (x.permute(2, 0, 1).contiguous().float() - self.mean) / self.std


class RandomCropFlip:
    """Pad by `pad` (zeros after normalisation, or reflection), crop back at a random offset,
    flip left-right with probability 1/2; then normalise."""

    def __init__(self, mean, std, pad: int = 4, flip: bool = True, mode: str = "constant"):
        self.norm, self.pad, self.flip, self.mode = Normalize(mean, std), pad, flip, mode

    def __call__(self, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        x = self.norm(x)
        h, w = x.shape[-2:]
        r = torch.randint(0, 2 * self.pad + 1, (2,), generator=g).tolist()
        flip = bool(torch.randint(0, 2, (1,), generator=g)) if self.flip else False
        if self.pad:
            x = F.pad(x, (self.pad,) * 4, mode=self.mode)
            x = x[:, r[0]:r[0] + h, r[1]:r[1] + w]
        if flip:
            x = x.flip(-1)
        return x.contiguous()
