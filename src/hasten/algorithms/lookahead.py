"""Lookahead: slow weights that pull the fast ones back every k steps (Zhang et al., 2019).

Every `k` optimizer steps: `slow <- slow + alpha * (fast - slow)`, then `fast <- slow`. The
inner optimizer explores for k steps; the slow weights average its trajectory, which damps
the noise of high learning rates. Slow weights are saved in checkpoints.

`ramp=p` (p > 0) makes the pull grow over the run instead of holding it fixed: at progress
t (fraction of max_duration) a sync uses `alpha_t = 1 - (1 - alpha) * t**p`, so early syncs
leave the fast weights almost alone (alpha_t near 1) and the last ones average strongly
(alpha_t = alpha at the end); the CIFAR speedrun line of work uses p = 3. `buffers=True`
also averages floating-point buffers (batch-norm running statistics) with the weights.

Functional form: `lookahead_sync(slow, fast, alpha)` (fused foreach ops). The Algorithm
keeps the slow copy and syncs after every k-th optimizer step.
"""
from __future__ import annotations

import torch

from ..core import Algorithm
from ..distributed.tensors import local_tensors, sharded_like
from ..registry import register_algorithm


@torch.no_grad()
def lookahead_sync(slow: list[torch.Tensor], fast: list[torch.Tensor], alpha: float) -> None:
    """One Lookahead synchronisation, in place: move the `slow` weights the fraction `alpha` toward the
    `fast` ones, then copy the slow weights into the fast ones."""
    torch._foreach_lerp_(slow, fast, alpha)
    torch._foreach_copy_(fast, slow)


@register_algorithm("lookahead")
class Lookahead(Algorithm):
    def __init__(self, k: int = 5, alpha: float = 0.5, ramp: float = 0.0, buffers: bool = False):
        if k < 1 or not 0.0 < alpha <= 1.0 or ramp < 0:
            raise ValueError(f"need k >= 1, 0 < alpha <= 1 and ramp >= 0, got k={k}, alpha={alpha}, ramp={ramp}")
        self.k, self.alpha, self.ramp, self.buffers = int(k), alpha, float(ramp), buffers
        self.slow: list[torch.Tensor] | None = None
        self.steps = 0

    def _params(self, state):
        # every floating-point parameter, trainable or not, so that the list stays the same
        # when a method freezes a parameter mid-run (one frozen from the start stays as it is)
        ts = [p for p in state.model.parameters() if p.is_floating_point()]
        if self.buffers:
            ts += [b for b in state.model.buffers() if b.is_floating_point()]
        return ts

    def alpha_at(self, progress: float) -> float:
        """The interpolation weight of a sync at `progress` (fraction of the run done)."""
        if not self.ramp:
            return self.alpha
        return 1.0 - (1.0 - self.alpha) * min(max(progress, 0.0), 1.0) ** self.ramp

    def fit_start(self, state, logger):
        live = self._params(state)
        if self.slow is None:
            self.slow = [p.detach().clone() for p in live]   # sharded like the model under FSDP
        else:   # loaded whole from a checkpoint: shard it as the model is
            self.slow = [sharded_like(s, p) for s, p in zip(self.slow, live)]

    def after_optim_step(self, state, logger):
        self.steps += 1
        if self.steps % self.k == 0:
            # progress including the step just taken (the timestamp advances after this event)
            done = min(state.progress + state.batch_fraction(), 1.0)
            lookahead_sync(local_tensors(self.slow), local_tensors([p.detach() for p in self._params(state)]),
                           self.alpha_at(done))

    def state_dict(self):
        return {"slow": self.slow, "steps": self.steps} if self.slow is not None else {}

    def load_state_dict(self, sd):
        if sd:
            self.slow, self.steps = [t.clone() for t in sd["slow"]], int(sd["steps"])


__all__ = ["lookahead_sync", "Lookahead"]
