"""What a task builds for the trainer."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass
class Built:
    model: torch.nn.Module
    train_dataloader: Any
    eval_dataloader: Any
    metrics: dict = field(default_factory=dict)
    loss_fn: Callable | None = None
    flops_per_sample: float | None = None
    info: dict = field(default_factory=dict)   # for the summary printed at the end
