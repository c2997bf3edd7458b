"""CutOut: zero a random square of each training image (DeVries and Taylor, 2017).

Works on any loader's batches on the device (`hasten.functional.cutout`, seeded per batch);
the DeviceLoader can also apply it itself (`data.cutout`), which is the cheaper path there.
"""
from __future__ import annotations

import torch

from ..core import Algorithm
from ..data.batches import check_images
from ..data.augment import cutout
from ..registry import register_algorithm
from ..seeding import derive_seed


@register_algorithm("cutout")
class CutOut(Algorithm):
    def __init__(self, size: int = 8):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = int(size)

    def after_dataloader(self, state, logger):
        batch = state.batch
        x = batch[0]
        check_images(x, "cutout")
        g = torch.Generator(device=x.device).manual_seed(derive_seed(state.seed, state.timestamp.batch, 13))
        state.batch = (cutout(x, self.size, g), *batch[1:])


__all__ = ["CutOut"]
