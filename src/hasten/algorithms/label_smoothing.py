"""Label smoothing: train against (1 - a) * one-hot + a / K instead of the one-hot target.

Functional form: `smoothed_cross_entropy(logits, targets, smoothing)` gives per-sample
losses; `smooth_labels(targets, num_classes, smoothing)` the soft targets;
`uniform_cross_entropy(logits)` the cross-entropy against the uniform target.

The Algorithm wraps the training loss (the loss seam): `(1 - a) * loss(outputs, targets) +
a * uniform_cross_entropy(outputs)`. With cross-entropy as the loss this is exactly the
smoothed cross-entropy; with a loss of your own it adds the same uniform-target term. The
term does not depend on the targets, so the wrapper composes in either order with methods
that mix targets (MixUp, CutMix). Evaluation uses the plain loss, so validation losses stay
comparable with runs that do not smooth. Targets equal to the ignore index (-100: masked-LM
positions that are not predicted) get no uniform term either. It needs logits: with ChunkedCrossEntropy, whose
loss never forms them, it is refused at the start of fit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core import Algorithm
from ..loss import IGNORE_INDEX, logits_of
from ..registry import register_algorithm


def _check_smoothing(smoothing) -> None:
    if isinstance(smoothing, (int, float)) and not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing must lie in [0, 1] (the share of the target spread over all classes), "
                         f"got {smoothing}")


def smooth_labels(targets: torch.Tensor, num_classes: int, smoothing: float) -> torch.Tensor:
    """Class indices -> soft targets (1 - smoothing) * one_hot + smoothing / num_classes."""
    _check_smoothing(smoothing)
    soft = torch.full((*targets.shape, num_classes), smoothing / num_classes, device=targets.device)
    return soft.scatter_add_(-1, targets.unsqueeze(-1),
                             torch.full_like(soft[..., :1], 1.0 - smoothing))


def smoothed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, smoothing: float) -> torch.Tensor:
    """Per-sample cross-entropy against smoothed targets, written as the mix of the target's
    negative log-likelihood and the mean negative log-probability over classes."""
    _check_smoothing(smoothing)
    logp = F.log_softmax(logits.float(), dim=-1)
    nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (1.0 - smoothing) * nll - smoothing * logp.mean(-1)


def uniform_cross_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per-sample (per-token, flattened for (B, T, V) logits) cross-entropy against the
    uniform distribution over classes: -mean_k log softmax(logits)_k."""
    if logits.dim() > 2:
        logits = logits.flatten(0, -2)
    return -F.log_softmax(logits.float(), dim=-1).mean(-1)


@register_algorithm("label_smoothing")
class LabelSmoothing(Algorithm):
    def __init__(self, smoothing: float = 0.1):
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must lie in [0, 1), got {smoothing}")
        self.smoothing = smoothing

    def wrap_loss(self, loss_fn):
        if getattr(loss_fn, "takes_hidden", False):
            raise ValueError("LabelSmoothing needs the model's logits, and ChunkedCrossEntropy's loss never forms "
                             "them: use one of the two")
        a = self.smoothing

        def smoothed(outputs, targets):
            inner = loss_fn(outputs, targets)
            uniform = uniform_cross_entropy(logits_of(outputs))   # a Hugging Face ModelOutput by its logits
            if isinstance(targets, torch.Tensor) and targets.dtype == torch.long and targets.numel() == uniform.numel():
                ignored = targets.reshape(uniform.shape) == IGNORE_INDEX   # positions that count nowhere stay at 0
                uniform = uniform.masked_fill(ignored, 0.0)
                return (1.0 - a) * inner + a * (uniform if inner.dim() else uniform.sum() / (~ignored).sum().clamp(min=1))
            return (1.0 - a) * inner + a * (uniform if inner.dim() else uniform.mean())
        smoothed.mixed_by = getattr(loss_fn, "mixed_by", None)   # a mixer wrapped inside stays known
        return smoothed


__all__ = ["smooth_labels", "smoothed_cross_entropy", "uniform_cross_entropy", "LabelSmoothing"]
