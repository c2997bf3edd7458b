"""MixUp: train on convex mixtures of pairs of samples and of their labels (Zhang et al., 2018).

Each batch is mixed with a permutation of itself: `x = lam * x + (1 - lam) * x[perm]`, with
`lam ~ Beta(alpha, alpha)` per batch; the per-sample loss becomes
`lam * CE(out, y) + (1 - lam) * CE(out, y[perm])`. Random numbers come from a generator
seeded by (seed, batch), so runs are reproducible and resume exactly.

Functional form: `mixup_batch(x, y, lam, perm)` and `mixed_loss(loss_fn, out, y, y_perm, lam)`.
The Algorithm mixes at AFTER_DATALOADER and wraps the training loss (the loss seam): the
wrapper is linear in the inner loss, so it composes with label smoothing in either order.
Evaluation uses the plain loss. MixUp and CutMix together are refused at the start of fit
(mixing a mixed batch needs both permutations' targets). Inputs must be floating point (images, features): token ids
cannot be mixed, and such a batch is refused.
"""
from __future__ import annotations

import random

import torch

from ..core import Algorithm
from ..registry import register_algorithm
from ..seeding import derive_seed


def mixup_batch(x: torch.Tensor, y: torch.Tensor, lam: float, perm: torch.Tensor):
    """Mix the batch with its permutation `perm`: returns (lam * x + (1 - lam) * x[perm], y, y[perm]);
    pass the two target sets and lam to mixed_loss."""
    if isinstance(lam, (int, float)) and not 0.0 <= lam <= 1.0:
        raise ValueError(f"mixup_batch: lam is the weight of the batch itself and must lie in [0, 1], got {lam}")
    return lam * x + (1.0 - lam) * x[perm], y, y[perm]


def mixed_loss(loss_fn, outputs, y_a, y_b, lam: float):
    """The MixUp/CutMix loss: `lam * loss_fn(outputs, y_a) + (1 - lam) * loss_fn(outputs, y_b)` (per-
    sample if loss_fn gives per-sample losses)."""
    return lam * loss_fn(outputs, y_a) + (1.0 - lam) * loss_fn(outputs, y_b)


class _MixAlgorithm(Algorithm):
    """Shared plumbing: draw (lam, perm), change the batch, wrap the loss while training."""

    def __init__(self, alpha: float = 0.2, prob: float = 1.0):
        if alpha <= 0 or not 0.0 <= prob <= 1.0:
            raise ValueError(f"need alpha > 0 and 0 <= prob <= 1, got alpha={alpha}, prob={prob}")
        self.alpha, self.prob = alpha, prob
        self._mix = None   # lam of the current batch (None: not mixed); the partner targets travel in the batch

    def _draw(self, state, n):
        seed = derive_seed(state.seed, state.timestamp.batch, 11)
        rng = random.Random(seed)                 # host-side draws: no device round trip
        use = rng.random() < self.prob
        lam = rng.betavariate(self.alpha, self.alpha)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(state.device)
        return use, lam, perm, rng

    def mix(self, x, y, lam, perm, rng):
        """Return the mixed inputs and the weight of the original labels."""
        raise NotImplementedError

    def wrap_loss(self, loss_fn):
        other = getattr(loss_fn, "mixed_by", None)
        if other:
            raise ValueError(f"{other} and {self.name} both mix the batch, and mixing a mixed batch needs the "
                             "targets of both permutations: use one of the two")

        def mixed(outputs, targets):
            if self._mix is None:
                return loss_fn(outputs, targets)
            y, y_b = targets   # (targets, partner targets), sliced with the batch into micro-batches and shares
            return mixed_loss(loss_fn, outputs, y, y_b, self._mix)
        mixed.mixed_by = self.name
        return mixed

    def after_dataloader(self, state, logger):
        batch = state.batch
        x, y = batch[0], batch[1]
        if not x.is_floating_point():
            raise ValueError(f"{self.name} mixes inputs, and these are {str(x.dtype).replace('torch.', '')} "
                             "(token ids?): use it on images or features")
        use, lam, perm, rng = self._draw(state, x.shape[0])
        if not use:
            self._mix = None
            return
        x, lam = self.mix(x, y, lam, perm, rng)
        self._mix = lam
        # the partner targets ride in the batch, so splitting it into micro-batches (grad_accum)
        # or into ranks' shares (data parallelism) keeps every sample with its own partner
        state.batch = (x, (y, y[perm]), *batch[2:])


@register_algorithm("mixup")
class MixUp(_MixAlgorithm):
    def mix(self, x, y, lam, perm, rng):
        return mixup_batch(x, y, lam, perm)[0], lam


__all__ = ["mixup_batch", "mixed_loss", "MixUp"]
