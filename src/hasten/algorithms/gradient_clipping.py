"""Gradient clipping: by global norm, by value, or adaptive (unit-wise, relative to the weights).

- `norm`: `torch.nn.utils.clip_grad_norm_` (the Trainer's `grad_clip_norm` adds this
  algorithm, last in the list: one owner of clipping);
- `value`: `torch.nn.utils.clip_grad_value_`;
- `adaptive` (AGC, Brock et al., 2021): each output unit's gradient row is scaled down so
  that `||g_i|| <= clip * max(||w_i||, eps)`; vectors (biases, gains) are left alone by
  default. It lets normaliser-free and large-batch training use high learning rates.

Functional form: `adaptive_clip_grad_(params, clip, eps)`. The Algorithm clips at
BEFORE_OPTIM_STEP, after unscaling fp16 gradients once per step (several clipping
algorithms may run; the scaler is unscaled by the first).
"""
from __future__ import annotations

import torch

from ..core import Algorithm
from ..registry import register_algorithm


@torch.no_grad()
def adaptive_clip_grad_(params, clip: float = 0.01, eps: float = 1e-3, skip_vectors: bool = True) -> None:
    """Adaptive gradient clipping (Brock et al., 2021), in place: each output unit's gradient is scaled
    down to at most `clip` times its weight norm (norms over all but the first dimension, weight
    norms at least `eps`). Vectors (biases, norms) are left alone with `skip_vectors`."""
    for p in params:
        if p.grad is None or (skip_vectors and p.dim() < 2):
            continue
        dims = tuple(range(1, p.dim())) if p.dim() > 1 else None
        w_norm = torch.linalg.vector_norm(p.detach(), dim=dims, keepdim=True).clamp_min(eps)
        g_norm = torch.linalg.vector_norm(p.grad, dim=dims, keepdim=True)
        max_norm = clip * w_norm
        p.grad.mul_(torch.where(g_norm > max_norm, max_norm / g_norm.clamp_min(1e-6), 1.0))


@register_algorithm("gradient_clipping")
class GradientClipping(Algorithm):
    def __init__(self, mode: str = "norm", threshold: float = 1.0, eps: float = 1e-3):
        if mode not in ("norm", "value", "adaptive"):
            raise ValueError(f"mode={mode!r}: use 'norm', 'value' or 'adaptive'")
        if not (isinstance(threshold, (int, float)) and threshold > 0) or not eps >= 0:
            raise ValueError(f"gradient clipping: threshold must be > 0 and eps >= 0, got threshold={threshold!r}, "
                             f"eps={eps!r}")
        self.mode, self.threshold, self.eps = mode, threshold, eps

    def before_optim_step(self, state, logger):
        if state.scaler is not None and state.grads_unscaled_at != state.timestamp.batch:
            for opt in state.optimizers:   # once per step, whoever clips first (fp16 loss scaling)
                state.scaler.unscale_(opt)
            state.grads_unscaled_at = state.timestamp.batch
        params = [p for p in state.model.parameters() if p.grad is not None]
        if self.mode == "norm":
            torch.nn.utils.clip_grad_norm_(params, self.threshold)
        elif self.mode == "value":
            torch.nn.utils.clip_grad_value_(params, self.threshold)
        else:
            adaptive_clip_grad_(params, self.threshold, self.eps)


__all__ = ["adaptive_clip_grad_", "GradientClipping"]
