"""A task as a typed spec: its config classes and its builder, and what the builder returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass
class Built:
    """What a task builds for the trainer."""
    model: torch.nn.Module
    train_dataloader: Any
    eval_dataloader: Any
    metrics: dict = field(default_factory=dict)
    loss_fn: Callable | None = None
    flops_per_sample: float | None = None
    info: dict = field(default_factory=dict)   # for the summary printed at the end


@dataclass
class NamedModel:
    """A `model` section that picks a model by name from a registry; `args` are its
    constructor's keyword arguments, checked against its signature. In YAML the arguments
    sit beside the name: `model: {name: speedrun, widths: [64, 256, 256]}`."""
    name: str
    args: dict = field(default_factory=dict)

    def as_recipe(self) -> dict:
        return {"name": self.name, **self.args}


@dataclass(frozen=True)
class TaskSpec:
    """How a recipe's `model` and `data` sections become a model and dataloaders.

    data_config: the dataclass of the `data` section (every task's has `batch_size`, the
        global batch of one optimizer step).
    model_config: the dataclass of the `model` section.
    parse_model: the raw `model` section -> a `model_config` (validated).
    build: `build(recipe, runtime) -> Built`; the runtime (hasten.runtime) is resolved and
        seeded before it is called, so the model it makes is initialised under the seed.
    """
    name: str
    description: str
    data_config: type
    model_config: type
    parse_model: Callable[[dict], Any]
    build: Callable[[Any, Any], Built]
    aliases: tuple[str, ...] = ()
