"""CutMix: paste a random box of another sample into each image; mix labels by area (Yun et al., 2019).

With `lam ~ Beta(alpha, alpha)` per batch, a box of area `(1 - lam)` of the image (clipped
at the borders) is copied from `x[perm]` into every image of the batch; the labels mix by
the box's actual area. Shares MixUp's plumbing (seeded draws, loss wrapping in training).

Functional form: `cutmix_batch(x, lam, perm, box)` with `box = cutmix_box(h, w, lam, rng)`.
"""
from __future__ import annotations

import math
import random

import torch

from ..registry import register_algorithm
from .mixup import _MixAlgorithm


def cutmix_box(h: int, w: int, lam: float, rng: random.Random) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of a box of about (1 - lam) of the image, centred at random."""
    cut = math.sqrt(1.0 - lam)
    bh, bw = int(h * cut), int(w * cut)
    cy, cx = rng.randrange(h), rng.randrange(w)
    return max(cy - bh // 2, 0), min(cy + bh - bh // 2, h), max(cx - bw // 2, 0), min(cx + bw - bw // 2, w)


def cutmix_batch(x: torch.Tensor, perm: torch.Tensor, box) -> tuple[torch.Tensor, float]:
    """Paste `box` from x[perm] into x; returns the mixed batch and the kept-area share lam."""
    t, b, l, r = box
    out = x.clone()
    out[..., t:b, l:r] = x[perm][..., t:b, l:r]
    h, w = x.shape[-2:]
    return out, 1.0 - (b - t) * (r - l) / (h * w)


@register_algorithm("cutmix")
class CutMix(_MixAlgorithm):
    def __init__(self, alpha: float = 1.0, prob: float = 1.0):
        super().__init__(alpha, prob)

    def mix(self, x, y, lam, perm, rng):
        return cutmix_batch(x, perm, cutmix_box(x.shape[-2], x.shape[-1], lam, rng))


__all__ = ["cutmix_box", "cutmix_batch", "CutMix"]
