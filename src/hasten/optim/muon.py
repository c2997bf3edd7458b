"""Muon for hidden matrices, AdamW for the rest (embeddings, output head, gains, biases).

`torch.optim.Muon` orthogonalises each 2-D update with a Newton-Schulz iteration. It takes
2-D parameters only; convolution kernels (4-D) are handled by `ConvMuon`, which runs the
same update on an (out_channels, in_channels * kh * kw) view of each kernel and its gradient.

    opts = muon_optimizers(model, muon_lr=0.02, adam_lr=3e-3)   # [Muon, AdamW]
    Trainer(..., optimizers=lambda m: muon_optimizers(m, ...))
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
    channels-last kernels get the same update."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients=(3.4445, -4.775, 2.0315), eps: float = 1e-7,
                 ns_steps: int = 5, adjust_lr_fn: str | None = None):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)
        torch.optim.Optimizer.__init__(self, params, defaults)   # Muon's own check allows 2-D only
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim < 2:
                    raise ValueError(f"ConvMuon takes parameters of rank >= 2, got shape {tuple(p.shape)}")

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


def muon_optimizers(model: torch.nn.Module, muon_lr: float = 0.02, muon_momentum: float = 0.95,
                    muon_weight_decay: float = 0.0, adam_lr: float = 3e-3, adam_betas=(0.9, 0.95),
                    adam_weight_decay: float = 0.0, exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
                    adjust_lr_fn: str | None = None, fused: bool | None = None,
                    ns_steps: int = 5) -> list[torch.optim.Optimizer]:
    hidden, other = split_for_muon(model, exclude)
    opts = []
    if hidden:
        ps = [p for _, p in hidden]
        kw = dict(lr=muon_lr, momentum=muon_momentum, weight_decay=muon_weight_decay, adjust_lr_fn=adjust_lr_fn,
                  ns_steps=ns_steps)
        opts.append(torch.optim.Muon(ps, **kw) if all(p.ndim == 2 for p in ps) else ConvMuon(ps, **kw))
        opts[-1].param_groups[0]["name"] = "muon"
    if other:
        dev = other[0][1].device.type
        opts.append(torch.optim.AdamW([p for _, p in other], lr=adam_lr, betas=tuple(adam_betas),
                                      weight_decay=adam_weight_decay,
                                      fused=fused if fused is not None else dev in ("cpu", "cuda")))
        opts[-1].param_groups[0]["name"] = "adamw"
    return opts
