"""One optimizer over several: for trainers that take a single optimizer (the Hugging Face
Trainer's `optimizers=`), e.g. Muon on the hidden matrices with AdamW on the rest.

    opt = CombinedOptimizer(muon_optimizers(model, muon_lr=0.02, adam_lr=3e-3))

Its `param_groups` are the inner optimizers' own group dicts, so a learning-rate scheduler
built on it scales every group, and each inner optimizer sees the change; `step` and
`zero_grad` call every inner optimizer; `state_dict` holds each one's.
"""
from __future__ import annotations

from typing import Sequence

import torch


class CombinedOptimizer(torch.optim.Optimizer):
    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]):
        optimizers = list(optimizers)
        if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
            raise TypeError("CombinedOptimizer takes a list of torch optimizers")
        params = [p for o in optimizers for g in o.param_groups for p in g["params"]]
        if len({id(p) for p in params}) != len(params):
            raise ValueError("CombinedOptimizer: a parameter is in two of the optimizers")
        super().__init__([{"params": params}], {})
        self.optimizers = optimizers
        self.param_groups = [g for o in optimizers for g in o.param_groups]   # the same dicts, not copies

    @property
    def state(self):
        merged = {}
        for o in getattr(self, "optimizers", ()):
            merged.update(o.state)
        return merged

    @state.setter
    def state(self, value):   # Optimizer.__init__ sets an empty one; the inner optimizers keep theirs
        pass

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for o in self.optimizers:
            o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        inner = state_dict.get("optimizers")
        if not isinstance(inner, list) or len(inner) != len(self.optimizers):
            raise ValueError("CombinedOptimizer.load_state_dict: the state holds "
                             f"{len(inner) if isinstance(inner, list) else 'no'} optimizers, this one {len(self.optimizers)}")
        for o, sd in zip(self.optimizers, inner):
            o.load_state_dict(sd)
        self.param_groups = [g for o in self.optimizers for g in o.param_groups]

    def __repr__(self) -> str:
        return f"CombinedOptimizer({', '.join(type(o).__name__ for o in self.optimizers)})"
