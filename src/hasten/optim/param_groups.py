"""Parameter-group rules: weight decay only on matrices, learning-rate multipliers by name."""
from __future__ import annotations

import fnmatch
from collections.abc import Iterable

import torch


def param_groups(model: torch.nn.Module | Iterable[tuple[str, torch.Tensor]], weight_decay: float, decay_min_dim: int = 2,
                 no_decay: tuple[str, ...] = (), lr_multipliers: dict[str, float] | None = None,
                 decay_ignores_lr_mult: bool = False) -> list[dict]:
    """Split parameters into groups.

    Weight decay applies to parameters with at least `decay_min_dim` dimensions (matrices and
    convolution kernels) whose names match none of the `no_decay` patterns (fnmatch, e.g.
    '*.bn*', 'wte.*'); norms' gains and biases get none. `lr_multipliers` maps name patterns
    to multipliers of the optimizer's lr; the first matching pattern wins. A parameter
    carrying an `lr_mult` attribute (set by algorithms such as FrozenBNScale) uses it.
    With `decay_ignores_lr_mult`, a group at m times the lr gets weight_decay / m, so its decay
    per step (lr * weight_decay, for coupled SGD) stays that of the base group: the multiplier
    speeds up the gradient, not the decay.
    Groups carry a 'name' so monitors can tell them apart. `model` may also be a list of
    (name, parameter) pairs, to group part of a model (the parameters Muon leaves to SGD).
    """
    lr_multipliers = lr_multipliers or {}
    groups: dict[tuple, dict] = {}
    named = model.named_parameters() if isinstance(model, torch.nn.Module) else model
    for name, p in named:
        if not p.requires_grad:
            continue
        decay = p.dim() >= decay_min_dim and not any(fnmatch.fnmatch(name, pat) for pat in no_decay)
        mult = getattr(p, "lr_mult", None) or next(
            (m for pat, m in lr_multipliers.items() if fnmatch.fnmatch(name, pat)), 1.0)
        key = (decay, mult)
        if key not in groups:
            label = ("decay" if decay else "no_decay") + (f"_lr{mult:g}" if mult != 1.0 else "")
            wd = (weight_decay / mult if decay_ignores_lr_mult else weight_decay) if decay else 0.0
            groups[key] = {"params": [], "weight_decay": wd,
                           "lr_mult": mult, "name": label}
        groups[key]["params"].append(p)
    return list(groups.values())


def apply_lr_multipliers(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Turn each group's 'lr_mult' into its lr (call once, right after building the optimizer)."""
    for g in optimizer.param_groups:
        g["lr"] = g["lr"] * g.get("lr_mult", 1.0)
    return optimizer
