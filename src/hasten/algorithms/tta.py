"""Test-time augmentation: average the logits of flipped and translated views of each image.

Views (weights): the image and its mirror (1/2 in all); with `translate=t`, also both of
those shifted by (+t, +t) and (-t, -t) pixels with reflect padding (the other 1/2). The
Algorithm evaluates with the augmented model at the final evaluation (or at every one with
`final_only=False`); its time is reported as method time, since it is part of the method.
"""
from __future__ import annotations

import time

import torch

from ..core import Algorithm, Event
from ..data.augment import translate as _translate


@torch.no_grad()
def tta_logits(model, x: torch.Tensor, flip: bool = True, translate: int = 0) -> torch.Tensor:
    """Weighted mean of the logits of the augmented views of the batch `x` (N, C, H, W)."""
    def views(z):
        out = model(z)
        return (out + model(z.flip(-1))) / 2 if flip else out

    logits = views(x)
    if translate:
        n = x.shape[0]
        d = torch.full((n,), translate, device=x.device)
        shifted = (views(_translate(x, d, d, translate)) + views(_translate(x, -d, -d, translate))) / 2
        logits = (logits + shifted) / 2
    return logits


class _TTAModel(torch.nn.Module):
    def __init__(self, model, flip, translate):
        super().__init__()
        self.model, self.flip, self.translate = model, flip, translate

    def forward(self, x):
        return tta_logits(self.model, x, self.flip, self.translate)


class TTA(Algorithm):
    events = (Event.EVAL_START, Event.EVAL_END)

    def __init__(self, flip: bool = True, translate: int = 1, final_only: bool = True):
        self.flip, self.translate, self.final_only = flip, int(translate), final_only
        self._saved = None
        self._t0 = None

    def apply(self, event, state, logger):
        if event == Event.EVAL_START:
            if self.final_only and state.progress < 1.0:
                return
            self._saved = state.forward_model
            state.forward_model = _TTAModel(self._saved, self.flip, self.translate)
            self._t0 = time.perf_counter()
        elif self._saved is not None:
            state.forward_model, self._saved = self._saved, None
            if state.device.type == "cuda":
                torch.cuda.synchronize()
            extra = state.extra
            extra["bench/method_setup_s"] = extra.get("bench/method_setup_s", 0.0) + time.perf_counter() - self._t0
