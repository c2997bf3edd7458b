"""EMA: an exponential moving average of the weights, used for evaluation.

Functional form: `ema_update(ema_tensors, model_tensors, decay=d)` does
`ema = d * ema + (1 - d) * model` for every tensor (one fused foreach call), and
`ema_update(..., share=s)` gives the newest weights the share `s` instead;
`ema_share(decay, updates, bias_correction)` is that share in update number `updates`.

The Algorithm keeps the averaged copy (parameters and floating-point buffers), updates it
every `update_every` batches after `start`, and swaps it in for evaluation, restoring the
trained weights afterwards. At the end of fit (`final_swap`) it keeps whichever of the average
and the trained weights evaluates better, and says which (hasten.algorithms._averaging); with
`bn_batches`, batch-norm statistics are recomputed for the average over that many training
batches (as SWA does) instead of averaged.

Bias correction (on by default), as Adam corrects its moments: update t gives the newest
weights the share (1 - d) / (1 - d^t) instead of (1 - d), so the average is the
decay-weighted mean of the weights seen so far and never holds the initial weights (the
first update copies). Without it, a short run's average is still mostly its
initialisation (0.99^16 = 85% after 16 updates of decay 0.99). The horizon can be given as
a half-life in typed time (`half_life="200ba"`, `"0.1dur"`, `"1ep"`) instead of a decay;
a horizon longer than the run is warned about at the start of fit.
"""
from __future__ import annotations

import math
import warnings

import torch

from ..core import Time
from ..distributed.tensors import local_tensors, sharded_like
from ..registry import register_algorithm
from ._averaging import WeightAverage, final_swap_mode, recompute_batchnorm


@torch.no_grad()
def ema_update(ema: list[torch.Tensor], current: list[torch.Tensor], *, decay: float | None = None,
               share: float | None = None) -> None:
    """Move every averaged tensor toward the model's, in place (one fused foreach call):
    `ema = (1 - share) * ema + share * current`. Give exactly one, by name: `decay`, the old
    average's weight (0.999 keeps 99.9%), or `share`, the newest weights' weight (what
    `ema_share` returns: 1 - decay, or more early on with bias correction)."""
    if (decay is None) == (share is None):
        raise TypeError("ema_update: give decay= (the average's weight) or share= (the newest weights'), one of them")
    w = 1.0 - decay if share is None else share
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"ema_update: {'share' if share is not None else '1 - decay'} = {w} must lie in [0, 1]")
    torch._foreach_lerp_(ema, current, w)


def ema_share(decay: float, updates: int, bias_correction: bool = True) -> float:
    """The newest weights' share in update number `updates` (1, 2, ...) of an average with
    `decay`: 1 - decay, or with bias correction (1 - decay) / (1 - decay ** updates), so the
    first update copies. Pass it as `ema_update(..., share=...)`."""
    if not bias_correction:
        return 1.0 - decay
    return (1.0 - decay) / (1.0 - decay ** updates)


def _tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters()] + [b for b in model.buffers() if b.is_floating_point()]


@register_algorithm("ema")
class EMA(WeightAverage):
    def __init__(self, decay: float | None = None, half_life: str | None = None, update_every: int = 1,
                 start: str = "0ba", final_swap: "bool | str" = True, bias_correction: bool = True, bn_batches: int = 0):
        if decay is not None and half_life is not None:
            raise ValueError("give either decay or half_life, not both")
        if decay is not None and not 0.0 < decay < 1.0:
            raise ValueError(f"decay must lie in (0, 1), got {decay}")
        if not isinstance(update_every, int) or update_every < 1:
            raise ValueError(f"update_every must be a whole number >= 1, got {update_every!r}")
        self.half_life = Time.parse(half_life) if half_life is not None else None
        if self.half_life is not None and not self.half_life.value > 0:
            raise ValueError(f"half_life must be positive, got {half_life}")
        self.decay = decay if decay is not None or half_life is not None else 0.999
        self.update_every, self.start, self.final_swap = update_every, Time.parse(start), final_swap_mode(final_swap)
        self.bias_correction = bias_correction
        if not isinstance(bn_batches, int) or bn_batches < 0:
            raise ValueError(f"bn_batches must be a whole number >= 0, got {bn_batches!r}")
        self.bn_batches = bn_batches
        self.ema: list[torch.Tensor] | None = None
        self.updates = 0

    def _init(self, state) -> None:
        live = _tensors(state.model)
        if self.ema is None:
            self.ema = [t.detach().clone() for t in live]   # sharded like the model under FSDP
        else:   # loaded whole from a checkpoint: shard it as the model is
            self.ema = [sharded_like(e, t) for e, t in zip(self.ema, live)]
        batch = state.batch_fraction()   # one batch as a fraction of the run (0: unknown)
        if self.half_life is not None:
            if not batch:
                raise ValueError(f"EMA half_life={self.half_life} needs a run whose length in batches is known")
            self.decay = 0.5 ** (batch / state.fraction_of(self.half_life))   # per batch
        if batch:
            run_batches = 1.0 / batch
            horizon = 1.0 / (1.0 - self.decay)   # batches: the average's time constant
            if horizon > run_batches:
                warnings.warn(f"EMA's horizon (about {horizon:.0f} batches, half-life "
                              f"{math.log(0.5) / math.log(self.decay):.0f}) is longer than the run "
                              f"({run_batches:.0f} batches): the average mostly holds early weights"
                              + ("" if self.bias_correction else ", and without bias correction the "
                                 "initial ones") + "; give a shorter half_life (e.g. '0.1dur')")

    def fit_start(self, state, logger):
        super().fit_start(state, logger)
        self._init(state)

    def batch_end(self, state, logger):
        if state.timestamp.batch % self.update_every == 0 and state.progress >= state.fraction_of(self.start):
            self.updates += 1
            d = self.decay ** self.update_every   # decay per update, compounded over the batches between
            ema_update(local_tensors(self.ema), local_tensors([t.detach() for t in _tensors(state.model)]),
                       share=ema_share(d, self.updates, self.bias_correction))

    def has_average(self) -> bool:
        return self.ema is not None

    def _tensors(self, state) -> list[torch.Tensor]:
        return _tensors(state.model)

    def _put_average(self, state) -> None:
        torch._foreach_copy_(local_tensors(_tensors(state.model)), local_tensors(self.ema))
        if self.bn_batches:
            recompute_batchnorm(state, self.bn_batches)

    def state_dict(self):
        return {"ema": self.ema, "updates": self.updates} if self.ema is not None else {}

    def load_state_dict(self, sd):
        if "ema" in sd:
            self.ema = [t.clone() for t in sd["ema"]]
            # checkpoints from before bias correction: the average is past its early updates
            self.updates = int(sd.get("updates", 10**9))


__all__ = ["ema_update", "ema_share", "EMA"]
