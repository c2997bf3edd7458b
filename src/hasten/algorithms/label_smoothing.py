"""Label smoothing: train against (1 - a) * one-hot + a / K instead of the one-hot target.

Functional form: `smoothed_cross_entropy(logits, targets, smoothing)` gives per-sample
losses; `smooth_labels(targets, num_classes, smoothing)` the soft targets. The Algorithm
replaces the training loss for the whole fit and restores the plain loss for evaluation, so
validation losses stay comparable with runs that do not smooth.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core import Algorithm, Event


def smooth_labels(targets: torch.Tensor, num_classes: int, smoothing: float) -> torch.Tensor:
    """Class indices -> soft targets (1 - smoothing) * one_hot + smoothing / num_classes."""
    soft = torch.full((*targets.shape, num_classes), smoothing / num_classes, device=targets.device)
    return soft.scatter_add_(-1, targets.unsqueeze(-1),
                             torch.full_like(soft[..., :1], 1.0 - smoothing))


def smoothed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, smoothing: float) -> torch.Tensor:
    """Per-sample cross-entropy against smoothed targets, written as the mix of the target's
    negative log-likelihood and the mean negative log-probability over classes."""
    logp = F.log_softmax(logits.float(), dim=-1)
    nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (1.0 - smoothing) * nll - smoothing * logp.mean(-1)


class LabelSmoothing(Algorithm):
    events = (Event.FIT_START, Event.EVAL_START, Event.EVAL_END, Event.FIT_END)

    def __init__(self, smoothing: float = 0.1):
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must lie in [0, 1), got {smoothing}")
        self.smoothing = smoothing
        self._plain = None

    def _smoothed(self, outputs, targets):
        if outputs.dim() > 2:   # (B, T, V) language-model logits: per-token losses
            return smoothed_cross_entropy(outputs.flatten(0, -2), targets.flatten(), self.smoothing)
        return smoothed_cross_entropy(outputs, targets, self.smoothing)

    def apply(self, event, state, logger):
        if event in (Event.FIT_START, Event.EVAL_END) and self._plain is None:
            self._plain = state.loss_fn
            state.loss_fn = self._smoothed
        elif event in (Event.EVAL_START, Event.FIT_END) and self._plain is not None:
            state.loss_fn, self._plain = self._plain, None
