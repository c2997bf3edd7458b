"""EMA: an exponential moving average of the weights, used for evaluation.

Functional form: `ema_update(ema_tensors, model_tensors, decay)` does
`ema = decay * ema + (1 - decay) * model` for every tensor (one fused foreach call).
The Algorithm keeps the averaged copy (parameters and floating-point buffers), updates it
every `update_every` batches after `start`, and swaps it in for evaluation (and at the end
of fit, when `final_swap`), restoring the trained weights afterwards.
"""
from __future__ import annotations

import torch

from ..core import Algorithm, Event, Time


@torch.no_grad()
def ema_update(ema: list[torch.Tensor], current: list[torch.Tensor], decay: float) -> None:
    torch._foreach_lerp_(ema, current, 1.0 - decay)


def _tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters()] + [b for b in model.buffers() if b.is_floating_point()]


class EMA(Algorithm):
    events = (Event.FIT_START, Event.BATCH_END, Event.EVAL_START, Event.EVAL_END, Event.FIT_END)

    def __init__(self, decay: float = 0.999, update_every: int = 1, start: str = "0ba", final_swap: bool = True):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must lie in (0, 1), got {decay}")
        self.decay, self.update_every, self.start, self.final_swap = decay, update_every, Time.parse(start), final_swap
        self.ema: list[torch.Tensor] | None = None
        self._backup: list[torch.Tensor] | None = None

    def _init(self, state) -> None:
        if self.ema is None:
            self.ema = [t.detach().clone() for t in _tensors(state.model)]

    def apply(self, event, state, logger):
        if event == Event.FIT_START:
            self._init(state)
        elif event == Event.BATCH_END:
            ts = state.timestamp
            if ts.batch % self.update_every == 0 and state.progress >= state.fraction_of(self.start):
                # decay per update, compounded over the batches between updates
                ema_update(self.ema, [t.detach() for t in _tensors(state.model)], self.decay ** self.update_every)
        elif event == Event.EVAL_START and self.ema is not None:
            self._swap_in(state)
        elif event == Event.EVAL_END and self._backup is not None:
            self._swap_out(state)
        elif event == Event.FIT_END and self.final_swap and self.ema is not None:
            with torch.no_grad():
                torch._foreach_copy_(_tensors(state.model), self.ema)

    @torch.no_grad()
    def _swap_in(self, state):
        live = _tensors(state.model)
        self._backup = [t.detach().clone() for t in live]
        torch._foreach_copy_(live, self.ema)

    @torch.no_grad()
    def _swap_out(self, state):
        torch._foreach_copy_(_tensors(state.model), self._backup)
        self._backup = None

    def state_dict(self):
        return {"ema": self.ema} if self.ema is not None else {}

    def load_state_dict(self, sd):
        if "ema" in sd:
            self.ema = [t.clone() for t in sd["ema"]]
