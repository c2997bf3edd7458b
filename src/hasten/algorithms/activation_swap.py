"""Activation swap: replace every activation module of one kind with another (e.g. ReLU -> GELU).

Done by module surgery at INIT, before the optimizer is built: activations have no
parameters here, and any that do (PReLU) get fresh ones that the optimizer factory then
sees, so the optimizer stays consistent with the model.

Functional form: `swap_activations(model, "relu", "gelu")` returns how many were replaced.
"""
from __future__ import annotations

import torch.nn as nn

from ..core import Algorithm
from ..registry import register_algorithm

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "celu": nn.CELU, "silu": nn.SiLU, "elu": nn.ELU,
               "leaky_relu": nn.LeakyReLU, "mish": nn.Mish, "hardswish": nn.Hardswish, "tanh": nn.Tanh}


def _cls(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def swap_activations(model: nn.Module, old: str, new: str, **kwargs) -> int:
    """In place: replace every activation module of type `old` (e.g. 'relu') in `model` with a new
    `new` module (e.g. 'gelu'), built with `kwargs`. Functional calls (F.relu) are not modules and
    are not swapped. Returns the number replaced."""
    old_cls, new_cls = _cls(old), _cls(new)
    count = 0
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if type(child) is old_cls:
                setattr(parent, name, new_cls(**kwargs))
                count += 1
    return count


@register_algorithm("activation_swap")
class ActivationSwap(Algorithm):
    def __init__(self, old: str = "relu", new: str = "gelu", kwargs: dict | None = None):
        _cls(old), _cls(new)
        self.old, self.new, self.kwargs = old, new, dict(kwargs or {})

    def init(self, state, logger):
        n = swap_activations(state.model, self.old, self.new, **self.kwargs)
        if n == 0:
            raise ValueError(f"activation swap: the model has no {self.old} modules (functional calls such as "
                             "F.relu cannot be swapped)")


__all__ = ["swap_activations", "ActivationSwap"]
