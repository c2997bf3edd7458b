"""Layer freezing: stop training the first layers progressively in the late part of the run.

Early layers converge first (Raghu et al., 2017, SVCCA); freezing them saves their weight
gradients and optimizer updates. From `start` (a fraction of the run) the first parameter
tensors, in model order, are frozen so that the frozen share grows linearly to `fraction`
at the end; with `ramp=False` the whole `fraction` is frozen at `start` (a block at once: the
backward pass then stops above it, which saves its activation gradients too). Frozen tensors
get `requires_grad=False`: autograd does not compute their weight gradients and the optimizer
skips them. Under DDP the Trainer builds DDP with `find_unused_parameters=True` (a walk of
the autograd graph per step) so that it does not wait for the frozen tensors' gradients.

Functional form: `freeze_first(model, fraction)` returns how many tensors are frozen.
"""
from __future__ import annotations

import torch

from ..core import Algorithm, as_time
from ..registry import register_algorithm


def _frozen_count(tensors: int, fraction: float) -> int:
    """How many of `tensors` parameter tensors `fraction` freezes (the first ones)."""
    return int(tensors * fraction)


def freeze_first(model: torch.nn.Module, fraction: float) -> int:
    """Stop the gradients of the first `fraction` of `model`'s parameter tensors, in the order
    `parameters()` gives them (the input side first for the usual models). Returns the number
    frozen."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"freeze_first: fraction (the share of parameter tensors frozen) must lie in [0, 1], "
                         f"got {fraction}")
    params = [p for p in model.parameters()]
    n = _frozen_count(len(params), fraction)
    for p in params[:n]:
        p.requires_grad_(False)
        p.grad = None
    return n


@register_algorithm("layer_freezing")
class LayerFreezing(Algorithm):
    def __init__(self, start: "float | str" = 0.5, fraction: float = 0.5, ramp: bool = True):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction (the share of tensors frozen at the end) must lie in [0, 1], got {fraction}")
        if not isinstance(ramp, bool):
            raise TypeError(f"ramp must be true (the frozen share grows to `fraction`) or false (all of it at "
                            f"`start`), got {ramp!r}")
        self.start, self.fraction, self.ramp = as_time(start, "start"), fraction, ramp
        if self.start.unit.value == "dur" and self.start.value >= 1.0:
            raise ValueError(f"start must lie before the end of the run, got {start}")
        self.frozen = 0        # tensors frozen so far (0 again after a resume: requires_grad is not checkpointed)
        self._tensors = None   # the model's parameter-tensor count, counted once

    def ddp_options(self):
        # parameters frozen part-way through: DDP must not wait for their gradients
        return {"find_unused_parameters": True}

    def batch_start(self, state, logger):
        p, start = state.progress, state.fraction_of(self.start)
        if p < start:
            return
        want = self.fraction * (p - start) / (1.0 - start) if self.ramp and start < 1.0 else self.fraction
        if self._tensors is None:
            self._tensors = sum(1 for _ in state.model.parameters())
        if _frozen_count(self._tensors, want) == self.frozen:
            return   # nothing new to freeze: no walk over the parameters this batch
        n = freeze_first(state.model, want)
        self.frozen = n
        logger.log({"layer_freezing/frozen_tensors": n})


__all__ = ["freeze_first", "LayerFreezing"]
