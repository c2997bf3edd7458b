"""Test-time augmentation: average the logits of flipped and translated views of each image.

Views (weights): the image and its mirror (1/2 in all); with `translate=t`, also both of
those shifted by (+t, +t) and (-t, -t) pixels with reflect padding (the other 1/2). The
Algorithm evaluates with the augmented model at the final evaluation (or at every one with
`final_only=False`); its time is reported as method time, since it is part of the method.

`fraction=f` < 1 spends the extra views only where they can matter: every image gets the
plain view, and the fraction f of each batch whose plain view is least sure (smallest margin
between the top two softmax probabilities) also gets the other views; the rest keep their
plain logits. With flips and translation that costs 1 + 5f forward passes per image instead
of 6; an image the plain view classifies by a wide margin rarely changes class when more
views are averaged in (measured on a trained model in docs/methods/tta.md).
"""
from __future__ import annotations

import math
import time

import torch

from ..core import Algorithm
from ..data.batches import check_images
from ..loss import logits_of
from ..data.augment import translate as _translate
from ..registry import register_algorithm


def _check_fraction(fraction: float) -> None:
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"tta: fraction must lie in [0, 1], got {fraction}")


@torch.no_grad()
def tta_logits(model, x: torch.Tensor, flip: bool = True, translate: int = 0, fraction: float = 1.0) -> torch.Tensor:
    """Weighted mean of the logits of the augmented views of the batch `x` (N, C, H, W).

    With `fraction` < 1 only that fraction of the batch (the images whose plain view gives the
    smallest top-1 over top-2 probability margin) gets the augmented views; the others keep
    the plain view's logits.
    """
    _check_fraction(fraction)
    check_images(x, "tta")

    def run(z):   # a Hugging Face ModelOutput is read by its logits
        return logits_of(model(z))

    def views(z):
        out = run(z)
        return (out + run(z.flip(-1))) / 2 if flip else out

    logits = run(x)
    n = x.shape[0]
    k = n if fraction >= 1.0 or logits.shape[-1] < 2 else math.ceil(fraction * n)
    if not (flip or translate) or k == 0:
        return logits
    idx = None
    if k < n:
        top2 = logits.float().softmax(-1).topk(2, dim=-1).values
        idx = (top2[:, 0] - top2[:, 1]).topk(k, largest=False).indices
        channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
        x = x[idx].contiguous(memory_format=torch.channels_last) if channels_last else x[idx]
    full = logits if idx is None else logits[idx]
    if flip:
        full = (full + run(x.flip(-1))) / 2
    if translate:
        d = torch.full((k,), translate, device=x.device)
        shifted = (views(_translate(x, d, d, translate)) + views(_translate(x, -d, -d, translate))) / 2
        full = (full + shifted) / 2
    if idx is None:
        return full
    out = logits.clone()
    out[idx] = full.to(out.dtype)
    return out


class _TTAModel(torch.nn.Module):
    def __init__(self, model, flip, translate, fraction):
        super().__init__()
        self.model, self.flip, self.translate, self.fraction = model, flip, translate, fraction
        self.started: float | None = None   # when its evaluation's first batch came

    def forward(self, x):
        if self.started is None:
            self.started = time.perf_counter()
        return tta_logits(self.model, x, self.flip, self.translate, self.fraction)


@register_algorithm("tta")
class TTA(Algorithm):
    def __init__(self, flip: bool = True, translate: int = 1, final_only: bool = True,
                 fraction: float = 1.0):
        _check_fraction(fraction)        # at construction, so a bad recipe fails before training
        self.flip, self.translate, self.final_only, self.fraction = flip, int(translate), final_only, float(fraction)
        # the augmented stand-in (None: not augmented) per evaluation under way: an evaluation
        # may run inside another (EMA and SWA evaluate the trained weights inside the final one)
        self._open: list[_TTAModel | None] = []

    def eval_start(self, state, logger):
        if self.final_only and state.progress < 1.0:
            self._open.append(None)
            return
        state.forward_model = _TTAModel(state.forward_model, self.flip, self.translate, self.fraction)
        self._open.append(state.forward_model)

    def eval_forwards(self, state, model, inputs):
        tta_logits(model, inputs, self.flip, self.translate, self.fraction)   # its views' shapes (compiled runs)

    def eval_end(self, state, logger):
        # method time: from the evaluation's first batch to its end, so it lies inside the
        # evaluation's own time (an inner evaluation runs before the outer's first batch)
        wrapped = self._open.pop() if self._open else None
        if wrapped is None:
            return
        state.forward_model = wrapped.model
        if wrapped.started is not None:
            if state.device.type == "cuda":
                torch.cuda.synchronize()
            state.method_seconds += time.perf_counter() - wrapped.started


__all__ = ["tta_logits", "TTA"]
