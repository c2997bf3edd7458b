"""SAM: sharpness-aware minimisation (Foret et al., 2021).

Each step computes the gradient g at the weights w, moves to the worst nearby point
`w + rho * g / ||g||`, computes the gradient there, returns to w and lets the optimizer
step with that second gradient. Two forward-backward passes per step: it pays for itself
only where flatter minima generalise better (long runs, small data, label noise).

Functional form: `sam_perturb(params, rho)` (returns the perturbations, applied in place)
and `sam_restore(params, perturbations)`. The Algorithm wraps the step seam; `interval`
makes only every n-th step a SAM step (the others are plain).

Both forward passes of a SAM step run in training mode, so by default both update batch
norm's running statistics, the second at the perturbed weights (`running_stats: both`, what
the card's figure was measured with). `running_stats: first` keeps only the update from the
pass at w, the statistics of the weights the model keeps; public SAM implementations commonly
do this.
"""
from __future__ import annotations

import torch

from ..core import Algorithm
from ..registry import register_algorithm
from ._bn_stats import restore_running_stats, running_stats_of

RUNNING_STATS = ("both", "first")


@torch.no_grad()
def sam_perturb(params: list[torch.Tensor], rho: float, eps: float = 1e-12) -> list[torch.Tensor]:
    """Sharpness-aware minimisation's ascent step, in place: add to every parameter its gradient scaled
    to total norm `rho` (the whole list's norm). Returns the perturbations, for sam_restore after
    the second backward."""
    grads = [p.grad for p in params]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = rho / (norm + eps)
    e = torch._foreach_mul(grads, scale)
    torch._foreach_add_(params, e)
    return e


@torch.no_grad()
def sam_restore(params: list[torch.Tensor], e: list[torch.Tensor]) -> None:
    """Undo sam_perturb: subtract the perturbations `e` from the parameters, in place."""
    torch._foreach_sub_(params, e)


@register_algorithm("sam")
class SAM(Algorithm):
    def __init__(self, rho: float = 0.05, interval: int = 1, running_stats: str = "both"):
        if rho <= 0 or interval < 1:
            raise ValueError(f"need rho > 0 and interval >= 1, got rho={rho}, interval={interval}")
        if running_stats not in RUNNING_STATS:
            raise ValueError(f"running_stats must be one of {', '.join(RUNNING_STATS)} (which of SAM's two passes "
                             f"updates batch norm's running statistics), got {running_stats!r}")
        self.rho, self.interval, self.running_stats = rho, int(interval), running_stats

    def wrap_step(self, step):
        def sam_step(state):
            step(state)
            if state.timestamp.batch % self.interval:
                return
            params = [p for p in state.model.parameters() if p.grad is not None]
            if state.scaler is not None:
                raise ValueError("SAM with fp16 loss scaling is not supported; use bf16-mixed or fp32")
            e = sam_perturb(params, self.rho)
            for p in params:
                p.grad = None
            logged = len(state.step_losses)
            stats = running_stats_of(state.model) if self.running_stats == "first" else None
            step(state)                       # the gradient at the perturbed point
            del state.step_losses[logged:]    # the logged loss is the one at the weights
            if stats is not None:
                restore_running_stats(stats)  # keep the statistics of the pass at w
            sam_restore(params, e)
        return sam_step


__all__ = ["sam_perturb", "sam_restore", "SAM"]
