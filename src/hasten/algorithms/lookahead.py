"""Lookahead: slow weights that pull the fast ones back every k steps (Zhang et al., 2019).

Every `k` optimizer steps: `slow <- slow + alpha * (fast - slow)`, then `fast <- slow`. The
inner optimizer explores for k steps; the slow weights average its trajectory, which damps
the noise of high learning rates. Slow weights are saved in checkpoints.

Functional form: `lookahead_sync(slow, fast, alpha)` (fused foreach ops). The Algorithm
keeps the slow copy and syncs after every k-th optimizer step.
"""
from __future__ import annotations

import torch

from ..core import Algorithm, Event


@torch.no_grad()
def lookahead_sync(slow: list[torch.Tensor], fast: list[torch.Tensor], alpha: float) -> None:
    torch._foreach_lerp_(slow, fast, alpha)
    torch._foreach_copy_(fast, slow)


class Lookahead(Algorithm):
    events = (Event.FIT_START, Event.AFTER_OPTIM_STEP)

    def __init__(self, k: int = 5, alpha: float = 0.5):
        if k < 1 or not 0.0 < alpha <= 1.0:
            raise ValueError(f"need k >= 1 and 0 < alpha <= 1, got k={k}, alpha={alpha}")
        self.k, self.alpha = int(k), alpha
        self.slow: list[torch.Tensor] | None = None
        self.steps = 0

    def _params(self, state):
        return [p for p in state.model.parameters() if p.requires_grad]

    def apply(self, event, state, logger):
        if event == Event.FIT_START:
            if self.slow is None:
                self.slow = [p.detach().clone() for p in self._params(state)]
            return
        self.steps += 1
        if self.steps % self.k == 0:
            lookahead_sync(self.slow, [p.detach() for p in self._params(state)], self.alpha)

    def state_dict(self):
        return {"slow": self.slow, "steps": self.steps} if self.slow is not None else {}

    def load_state_dict(self, sd):
        if sd:
            self.slow, self.steps = [t.clone() for t in sd["slow"]], int(sd["steps"])
