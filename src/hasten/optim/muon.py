"""Muon for hidden matrices, AdamW (or SGD) for the rest (embeddings, output head, gains, biases).

`torch.optim.Muon` orthogonalises each 2-D update with a Newton-Schulz iteration. It takes
2-D parameters only; convolution kernels (4-D) are handled by `ConvMuon`, which runs the
same update on an (out_channels, in_channels * kh * kw) view of each kernel and its gradient.

    opts = muon_optimizers(model, muon_lr=0.02, adam_lr=3e-3)   # [Muon, AdamW]
    Trainer(..., optimizers=lambda m: muon_optimizers(m, ...))

Recipes with `optimizer.muon_others: sgd` give the rest to SGD instead, with the usual
parameter-group rules (weight decay by rank, learning-rate multipliers); see `hasten.build`.
"""
from __future__ import annotations

import fnmatch

import torch

DEFAULT_EXCLUDE = ("*wte*", "*wpe*", "*embed*", "*lm_head*", "*head*", "fc.*", "*.fc.weight")


def split_for_muon(model: torch.nn.Module, exclude: tuple[str, ...] = DEFAULT_EXCLUDE):
    """(hidden matrices for Muon, everything else), by name; tied parameters count once."""
    hidden, other, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if p.ndim >= 2 and not any(fnmatch.fnmatch(name, pat) for pat in exclude):
            hidden.append((name, p))
        else:
            other.append((name, p))
    return hidden, other


def _matrix(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A (dim 0, rest) matrix of `t` with columns ordered as `like`'s memory: a view when the
    layouts agree (contiguous or channels-last), so updates write through."""
    if like.ndim == 4 and not like.is_contiguous() and like.is_contiguous(memory_format=torch.channels_last):
        return t.permute(0, 2, 3, 1).reshape(t.shape[0], -1)
    return t.reshape(t.shape[0], -1)


class ConvMuon(torch.optim.Muon):
    """torch.optim.Muon for parameters of rank >= 2: each parameter and its gradient are seen
    as a matrix (dim 0 by the rest, a view of the parameter, so the update lands in place).
    Orthogonalisation does not depend on the order of columns, so contiguous and
    channels-last kernels get the same update.

    `normalize_weights=True` rescales each parameter to Frobenius norm sqrt(dim 0) before its
    update (the airbench Muon procedure for conv filters followed by batch norm: the layer's
    function ignores the filters' scale, so fixing it makes the learning rate the size of each
    step relative to the weights, for the whole run)."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients=(3.4445, -4.775, 2.0315), eps: float = 1e-7,
                 ns_steps: int = 5, adjust_lr_fn: str | None = None, normalize_weights: bool = False):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn,
                        normalize_weights=normalize_weights)
        torch.optim.Optimizer.__init__(self, params, defaults)   # Muon's own check allows 2-D only
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim < 2:
                    raise ValueError(f"ConvMuon takes parameters of rank >= 2, got shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            if group.get("normalize_weights"):
                for p in group["params"]:
                    if p.grad is not None:
                        p.mul_(p.shape[0] ** 0.5 / p.norm().clamp_min(group["eps"]))
        return super().step(closure)

    def _init_group(self, group, params_with_grad, grads, muon_momentum_bufs):
        for p in group["params"]:
            if p.grad is None:
                continue
            view = _matrix(p, p)
            if view.data_ptr() != p.data_ptr() or not view._is_view() and view is not p:
                raise RuntimeError("ConvMuon needs contiguous or channels-last parameters")
            params_with_grad.append(view)
            g = _matrix(p.grad, p)
            grads.append(g)
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(g, memory_format=torch.preserve_format)
            muon_momentum_bufs.append(state["momentum_buffer"])
        return False


def muon_for(params: list[torch.Tensor], lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.0,
             adjust_lr_fn: str | None = None, ns_steps: int = 5, normalize_weights: bool = False,
             nesterov: bool = True) -> torch.optim.Optimizer:
    """torch.optim.Muon when every parameter is a matrix (and no normalisation is asked), else ConvMuon."""
    kw = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, adjust_lr_fn=adjust_lr_fn, ns_steps=ns_steps,
              nesterov=nesterov)
    if all(p.ndim == 2 for p in params) and not normalize_weights:
        opt = torch.optim.Muon(params, **kw)
    else:
        opt = ConvMuon(params, normalize_weights=normalize_weights, **kw)
    opt.param_groups[0]["name"] = "muon"
    return opt


def muon_optimizers(model: torch.nn.Module, muon_lr: float = 0.02, muon_momentum: float = 0.95,
                    muon_weight_decay: float = 0.0, adam_lr: float = 3e-3, adam_betas=(0.9, 0.95),
                    adam_weight_decay: float = 0.0, exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
                    adjust_lr_fn: str | None = None, fused: bool | None = None,
                    ns_steps: int = 5, normalize_weights: bool = False) -> list[torch.optim.Optimizer]:
    hidden, other = split_for_muon(model, exclude)
    opts = []
    if hidden:
        opts.append(muon_for([p for _, p in hidden], muon_lr, muon_momentum, muon_weight_decay, adjust_lr_fn,
                             ns_steps, normalize_weights))
    if other:
        dev = other[0][1].device.type
        opts.append(torch.optim.AdamW([p for _, p in other], lr=adam_lr, betas=tuple(adam_betas),
                                      weight_decay=adam_weight_decay,
                                      fused=fused if fused is not None else dev in ("cpu", "cuda")))
        opts[-1].param_groups[0]["name"] = "adamw"
    return opts
