"""Progressive resizing: train on downscaled images early, full size late.

The image side grows linearly from `initial_scale` of full size at `start` to full size at
`finish` (fractions of the run), rounded to a multiple of `size_increment` pixels; batches
are resized with `F.interpolate` (area for downscaling). Early steps cost about
scale^2 of a full step. Evaluation always runs at full size.

Functional form: `resize_batch(x, scale, size_increment)`; `resize_scale(progress, ...)`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core import Algorithm, as_time
from ..data.batches import check_images
from ..registry import register_algorithm


def resize_scale(progress: float, initial_scale: float, start: float, finish: float) -> float:
    """The image scale at training `progress` (0 to 1): `initial_scale` until `start`, rising linearly
    to 1 at `finish`, 1 after."""
    if progress <= start:
        return initial_scale
    if progress >= finish:
        return 1.0
    return initial_scale + (1.0 - initial_scale) * (progress - start) / (finish - start)


def resize_batch(x: torch.Tensor, scale: float, size_increment: int = 4) -> torch.Tensor:
    """Resize the images `x` (N, C, H, W) by `scale`, each side rounded to a multiple of
    `size_increment` (area interpolation down, bilinear up), keeping a channels-last layout. Returns
    `x` itself when the size does not change."""
    if not scale > 0 or size_increment < 1:
        raise ValueError(f"resize_batch: need scale > 0 and size_increment >= 1, got scale={scale}, "
                         f"size_increment={size_increment}")
    h, w = x.shape[-2:]
    nh = max(size_increment, int(round(h * scale / size_increment)) * size_increment)
    nw = max(size_increment, int(round(w * scale / size_increment)) * size_increment)
    if (nh, nw) == (h, w):
        return x
    mode = "area" if nh < h else "bilinear"
    out = F.interpolate(x, size=(nh, nw), mode=mode, **({} if mode == "area" else {"align_corners": False}))
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        out = out.contiguous(memory_format=torch.channels_last)
    return out


@register_algorithm("progressive_resizing")
class ProgressiveResizing(Algorithm):
    def __init__(self, initial_scale: float = 0.5, start: "float | str" = 0.0, finish: "float | str" = 0.6,
                 size_increment: int = 4):
        if not 0.0 < initial_scale <= 1.0:
            raise ValueError(f"need 0 < initial_scale <= 1, got {initial_scale}")
        self.start, self.finish = as_time(start, "start"), as_time(finish, "finish")
        if self.start.unit == self.finish.unit and self.start.value > self.finish.value:
            raise ValueError(f"need start <= finish, got start={start}, finish={finish}")
        self.initial_scale, self.size_increment = initial_scale, size_increment

    def batch_variants(self, state, batch) -> list:
        """The batch at every image size the schedule will produce, the full size included
        (compiled runs warm them up)."""
        x = batch[0]
        if not (isinstance(x, torch.Tensor) and x.dim() == 4):
            return []
        h = x.shape[-2]
        steps = max(2, int(h * (1 - self.initial_scale) / self.size_increment) + 2)
        seen, out = set(), []
        for i in range(steps + 1):
            s = self.initial_scale + (1 - self.initial_scale) * i / steps
            r = resize_batch(x, s, self.size_increment)
            if tuple(r.shape) not in seen:
                seen.add(tuple(r.shape))
                out.append((r, *batch[1:]))
        return out

    def init(self, state, logger):
        model = state.model
        if type(model).__module__.startswith("transformers") and getattr(getattr(model, "config", None), "image_size", None):
            raise ValueError("progressive_resizing changes the image size, and a Hugging Face vision model refuses other "
                             "sizes: wrap it in hasten.integrations.hf.HFImageClassifier (it interpolates the positions)")

    def after_dataloader(self, state, logger):
        check_images(state.batch[0], "progressive_resizing")
        s = resize_scale(state.progress, self.initial_scale, state.fraction_of(self.start),
                         state.fraction_of(self.finish))
        if s < 1.0:
            batch = state.batch
            state.batch = (resize_batch(batch[0], s, self.size_increment), *batch[1:])


__all__ = ["resize_scale", "resize_batch", "ProgressiveResizing"]
