"""Gradual magnitude pruning during training (Zhu and Gupta, 2017): the sparsity rises from
`initial` at `start` to `sparsity` at `end` along a cubic ramp, fast at first while the
network can still recover, slowly near the end; every `interval` the smallest weights are
masked to reach the scheduled sparsity.

    s(t) = sparsity + (initial - sparsity) * (1 - (t - start) / (end - start))^3

Functional form: `cubic_sparsity(progress, sparsity, start, end, initial)` and
`magnitude_masks(weights, masks, sparsity)` (new masks, computed on the device with no host
synchronisation). The Algorithm puts an all-ones mask on every prunable layer at INIT
(`torch.nn.utils.prune`: the layer then holds `weight_orig`, a parameter, and `weight_mask`,
a buffer), so optimizers are built over `weight_orig` and every checkpoint carries the masks
in the model's state dict: a resumed run continues with exactly the masks it had. Masks only
ever lose entries; at each pruning step the newly masked entries of `weight_orig` are zeroed.

With Muon: the gradient of `weight_orig` is zero where masked, but Muon's orthogonalised
update is dense, so masked entries of `weight_orig` drift again after the pruning step (they
stay out of the forward, which uses `weight_orig * weight_mask`); with `normalize: true` the
kernel's norm includes them. The pruned network is what the masks say; `hasten compress`
folds them into the weights (`make_permanent`).
"""
from __future__ import annotations

import torch
import torch.nn.utils.prune as prune

from ..core import Algorithm, Interval, as_time
from ..registry import register_algorithm
from .magnitude_pruning import check_sparsity, magnitude_masks, prunable_weights


def cubic_sparsity(progress: float, sparsity: float, start: float = 0.0, end: float = 1.0,
                   initial: float = 0.0) -> float:
    """The scheduled sparsity at `progress` (fractions of the run): 0 before `start`."""
    if progress < start:
        return 0.0
    t = 1.0 if end <= start else min(max((progress - start) / (end - start), 0.0), 1.0)
    return sparsity + (initial - sparsity) * (1.0 - t) ** 3


@register_algorithm("gradual_pruning")
class GradualPruning(Algorithm):
    """sparsity: the final fraction of prunable weights masked; start, end: when the ramp
    starts and ends (typed time or fractions of the run); interval: how often masks are
    updated; scope: 'global' (one threshold over all layers) or 'layer'; initial: the
    sparsity reached at the first pruning step."""

    def __init__(self, sparsity: float = 0.5, start: "float | str" = 0.1, end: "float | str" = 0.75,
                 interval: str = "10ba", scope: str = "global", initial: float = 0.0):
        self.sparsity = check_sparsity(sparsity, "gradual_pruning: sparsity")
        self.initial = check_sparsity(initial, "gradual_pruning: initial")
        if self.initial > self.sparsity:
            raise ValueError(f"gradual_pruning: initial ({initial}) must not exceed sparsity ({sparsity})")
        if scope not in ("global", "layer"):
            raise ValueError(f"gradual_pruning: scope must be 'global' or 'layer', got {scope!r}")
        self.start, self.end = as_time(start, "start"), as_time(end, "end")
        self.every = Interval(interval)
        self.scope = scope
        self.layers: list = []
        self.current_sparsity = 0.0   # the sparsity of the last pruning step

    def fsdp_refusal(self):
        return "gradual_pruning keeps masks beside each weight; with a sharded model (FSDP) it is not supported yet"

    def init(self, state, logger):
        self.layers = prunable_weights(state.model)
        if not self.layers:
            raise ValueError("gradual_pruning: the model has no conv or linear layers to prune")
        for _, m in self.layers:
            if not prune.is_pruned(m):
                prune.identity(m, "weight")

    def fit_start(self, state, logger):
        self.every.start(state.timestamp, state.progress)

    def target(self, state) -> float:
        return cubic_sparsity(state.progress, self.sparsity, state.fraction_of(self.start),
                              state.fraction_of(self.end), self.initial)

    def batch_end(self, state, logger):
        if not self.every.due(state.timestamp, state.progress):
            return
        s = self.target(state)
        if s <= 0.0:
            return
        mods = [m for _, m in self.layers]
        new = magnitude_masks([m.weight_orig for m in mods], [m.weight_mask for m in mods], s, self.scope)
        with torch.no_grad():
            for m, mask in zip(mods, new):
                m.weight_mask.copy_(mask)
                m.weight_orig.mul_(mask)
        self.current_sparsity = s

    def state_dict(self) -> dict:
        return {}   # the masks live in the model's state dict; the schedule follows the clock


__all__ = ["GradualPruning", "cubic_sparsity"]
