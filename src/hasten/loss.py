"""The default loss and the one error for a loss that does not fit the model's outputs.

The loss contract: `loss_fn(outputs, targets)` returns per-sample (or per-token) losses, or a
scalar; the Trainer reduces (hasten.trainer.Trainer.reduce_loss), so algorithms can reweight
or drop samples between the two (the AFTER_LOSS event).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .errors import TrainingError

IGNORE_INDEX = -100   # a target that counts nowhere: cross-entropy's (and Hugging Face's) convention

# errors a loss raises when the model's outputs do not fit it (out-of-memory is not one)
LOSS_FAULTS = (ValueError, IndexError, TypeError, RuntimeError)


def logits_of(outputs):
    """The logits of a model's outputs: a tensor as it is, a `ModelOutput` (or dict) by its
    `logits`; anything else is refused naming what it was."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    logits = getattr(outputs, "logits", None)
    if logits is None and isinstance(outputs, dict):
        logits = outputs.get("logits")
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"the model returned a {type(outputs).__name__} without logits; wrap it so it "
                        "returns logits (hasten.integrations.hf has adapters for Hugging Face models)")
    return logits


def default_loss(outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    """Per-sample (or per-token) cross-entropy: the Trainer does the reduction. A target equal
    to IGNORE_INDEX (-100) gets loss 0 and is left out of the mean (the Trainer divides by the
    targets that count).

    When nothing listens to AFTER_LOSS and there is one micro-batch in one process, the Trainer
    asks for reduction="mean" instead: the same number, computed inside the loss kernel.
    A Hugging Face `ModelOutput` is read by its logits.
    """
    if not isinstance(outputs, torch.Tensor):
        outputs = logits_of(outputs)
    if outputs.dim() > 2:  # (B, T, V) language-model logits
        return F.cross_entropy(outputs.flatten(0, -2).float(), targets.flatten(), reduction=reduction)
    return F.cross_entropy(outputs, targets, reduction=reduction)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} ({str(x.dtype).replace('torch.', '')})"
    if isinstance(x, dict):
        return f"a dict with keys {sorted(map(str, x))[:6]}"
    return f"a {type(x).__name__}"


def loss_fault(error: Exception | None, outputs, targets, returned: Any = None) -> Exception:
    """hasten's error for a loss that cannot be computed or returns no tensor; an
    out-of-memory error passes through as it is."""
    if isinstance(error, torch.OutOfMemoryError):
        return error
    if error is None:
        return TrainingError(f"the loss function returned {_describe(returned)}; it must return a tensor of "
                             "per-sample (or per-token) losses, or a scalar")
    return TrainingError(f"the loss function failed on the model's outputs ({_describe(outputs)}) and the "
                         f"targets ({_describe(targets)}): {type(error).__name__}: {str(error).rstrip('.')}. Check that the "
                         "model's outputs fit the loss (e.g. logits (batch, classes) with class-index targets)")


def checked_loss(loss_fn, outputs, targets) -> torch.Tensor:
    """`loss_fn(outputs, targets)`, or hasten's one-line error when it fails or returns no tensor."""
    try:
        loss = loss_fn(outputs, targets)
    except LOSS_FAULTS as e:
        raise loss_fault(e, outputs, targets) from e
    if not isinstance(loss, torch.Tensor):
        raise loss_fault(None, outputs, targets, loss)
    return loss
