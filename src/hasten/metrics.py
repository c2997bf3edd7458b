"""Evaluation metrics the tasks add to val/loss, as torchmetrics metrics (they synchronise
across ranks themselves). torchmetrics takes seconds to import: each factory imports it when
a task is built, not at start-up.

- `bits_per_byte(token_bytes)`: the cross-entropy of the targets in bits, over the bytes of
  text they stand for (special tokens: none), so models with different tokenizers compare;
- `masked_accuracy()`: top-1 accuracy over the targets that are not the ignore index (-100),
  e.g. the masked positions of a masked-LM batch;
- `accuracy(classes)`, `f1(classes)`: over class labels.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .loss import IGNORE_INDEX


def bits_per_byte(token_bytes: np.ndarray):
    from torchmetrics import Metric   # heavy: imported when a task is built

    class BitsPerByte(Metric):
        full_state_update = False

        def __init__(self):
            super().__init__()
            self.register_buffer("bytes_of", torch.as_tensor(token_bytes, dtype=torch.float64), persistent=False)
            self.add_state("nll", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("bytes", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

        def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
            keep = targets != IGNORE_INDEX
            self.nll += F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), reduction="sum",
                                        ignore_index=IGNORE_INDEX).double()
            self.bytes += self.bytes_of.to(targets.device)[targets[keep]].sum()

        def compute(self) -> torch.Tensor:
            return self.nll / self.bytes.clamp_min(1.0) / math.log(2)

    return BitsPerByte()


def masked_accuracy():
    from torchmetrics import Metric   # heavy: imported when a task is built

    class MaskedAccuracy(Metric):
        full_state_update = False

        def __init__(self):
            super().__init__()
            self.add_state("right", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("count", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

        def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
            keep = targets != IGNORE_INDEX
            self.right += (logits.argmax(-1)[keep] == targets[keep]).sum().double()
            self.count += keep.sum().double()

        def compute(self) -> torch.Tensor:
            return self.right / self.count.clamp_min(1.0)

    return MaskedAccuracy()


def accuracy(classes: int):
    from torchmetrics.classification import MulticlassAccuracy   # heavy: imported when a task is built
    return MulticlassAccuracy(classes, average="micro")


def f1(classes: int):
    """Macro-averaged F1 over the classes (each class's F1 counts alike, whatever its share)."""
    from torchmetrics.classification import MulticlassF1Score   # heavy: imported when a task is built
    return MulticlassF1Score(classes, average="macro")
