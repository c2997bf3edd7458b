"""Muon for hidden matrices, AdamW (or SGD) for the rest (embeddings, output head, gains, biases).

`torch.optim.Muon` orthogonalises each 2-D update with a Newton-Schulz iteration. It takes
2-D parameters only; convolution kernels (4-D) are handled by `ConvMuon`, which runs the
same update on an (out_channels, in_channels * kh * kw) view of each kernel and its gradient.

    opts = muon_optimizers(model, muon_lr=0.02, adam_lr=3e-3)   # [Muon, AdamW]
    Trainer(..., optimizers=lambda m: muon_optimizers(m, ...))

Recipes with `optimizer.muon_others: sgd` give the rest to SGD instead, with the usual
parameter-group rules (weight decay by rank, learning-rate multipliers); see `hasten.build`.

The Newton-Schulz iteration's precision (`ns_dtype`): torch.optim.Muon always runs it in
bf16, which is fast on GPUs and on CPUs with AVX512-BF16 or AMX, but emulated, and slow,
on other CPUs: for the kernels of the CIFAR speedrun net, three iterations took 2.47 s a
step in bf16 against 0.047 s in fp32 on a 2-core AVX2-only EPYC, a quarter of each training
step (benchmarks/probes/muon_ns_cost.py). `ns_dtype="auto"` (the default) follows the run's
precision: bf16 under `precision="bf16-mixed"` (which `precision: auto` picks on GPUs and on
CPUs with bf16 hardware), fp32 otherwise, so a user who asks for fp32 gets fp32 everywhere;
'bf16' or 'fp32' set it outright. The two give updates that differ by bf16 rounding (about
0.5% relative). The Trainer built from a recipe passes the runtime's precision; called
directly, these functions take `precision=` (default fp32).
"""
from __future__ import annotations

import fnmatch
import math

import torch

from ..distributed.tensors import is_dtensor

NS_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
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


def ns_dtype_for(setting: str, precision: str = "fp32") -> torch.dtype:
    """The dtype of the Newton-Schulz iteration: 'bf16', 'fp32', or 'auto' (bf16 when the run's
    precision is bf16-mixed, fp32 otherwise)."""
    if setting == "auto":
        return torch.bfloat16 if precision == "bf16-mixed" else torch.float32
    if setting not in NS_DTYPES:
        raise ValueError(f"ns_dtype must be 'auto', 'bf16' or 'fp32', got {setting!r}")
    return NS_DTYPES[setting]


def newton_schulz(g: torch.Tensor, coefficients=(3.4445, -4.775, 2.0315), steps: int = 5, eps: float = 1e-7,
                  dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Orthogonalise a matrix (singular values pushed towards 1) with the quintic Newton-Schulz
    iteration torch.optim.Muon uses, computed in `dtype`; returns a tensor of that dtype. A stack
    of same-shape matrices (b, m, n) is orthogonalised matrix by matrix in batched products:
    one launch per product for the whole stack."""
    if g.ndim not in (2, 3):
        raise ValueError(f"newton_schulz takes a matrix or a stack of matrices, got shape {tuple(g.shape)}")
    a, b, c = coefficients
    x = g.to(dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    if x.ndim == 2:
        x = x / x.norm().clamp(min=eps)
        for _ in range(steps):
            gram = x @ x.T
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    else:
        x = x / torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=eps)
        for _ in range(steps):
            gram = x @ x.mT
            x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def orthogonalise_all(updates: list, orthogonalise) -> list:
    """`orthogonalise` applied to each matrix of `updates`, same-shape matrices (same dtype and
    device) stacked and done in one batched call: fewer, larger launches (a network's blocks
    often repeat a shape: three of the CIFAR speedrun net's six Muon kernels are 256 x 2304)."""
    out: list = [None] * len(updates)
    groups: dict = {}
    for i, u in enumerate(updates):
        groups.setdefault((tuple(u.shape), u.dtype, u.device), []).append(i)
    for idx in groups.values():
        if len(idx) == 1:
            out[idx[0]] = orthogonalise(updates[idx[0]])
        else:
            done = orthogonalise(torch.stack([updates[i] for i in idx]))
            for j, i in enumerate(idx):
                out[i] = done[j]
    return out


def _lr_ratio(adjust_lr_fn: str | None, rows: int, cols: int) -> float:
    # torch.optim.Muon's rules: 'original' keeps update RMS at sqrt(max(1, rows/cols)) times
    # an orthogonal matrix's; 'match_rms_adamw' scales to AdamW's typical update RMS (0.2).
    if adjust_lr_fn in (None, "original"):
        return math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"adjust_lr_fn must be None, 'original' or 'match_rms_adamw', got {adjust_lr_fn!r}")


def _descend(p: torch.Tensor, update: torch.Tensor, lr, ratio: float) -> None:
    """p -= lr * ratio * update, with lr a float or a 0-dim tensor (held as a tensor for compiled
    steps: read on the device, never turned into a Python number)."""
    if isinstance(lr, torch.Tensor):
        p.addcmul_(update, lr, value=-ratio)
    else:
        p.add_(update, alpha=-lr * ratio)


def _matrix(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A (dim 0, rest) matrix of `t` with columns ordered as `like`'s memory: a view when the
    layouts agree (contiguous or channels-last), so updates write through."""
    if like.ndim == 4 and not like.is_contiguous() and like.is_contiguous(memory_format=torch.channels_last):
        return t.permute(0, 2, 3, 1).reshape(t.shape[0], -1)
    return t.reshape(t.shape[0], -1)


def _whole_matrix_update(update, orthogonalise):
    """Muon under FSDP: the Newton-Schulz iteration needs the whole matrix, so the sharded
    update is gathered (every rank computes the same orthogonalisation) and each rank keeps
    its shard of the result. The momentum buffers stay sharded; the gather costs one
    all-gather of each matrix per step, and the iteration runs on every rank."""
    from torch.distributed.tensor import distribute_tensor
    whole = update.full_tensor()
    done = orthogonalise(_matrix(whole, whole)).reshape(whole.shape).to(update.dtype)
    return distribute_tensor(done, update.device_mesh, update.placements, src_data_rank=None)


class ConvMuon(torch.optim.Muon):
    """torch.optim.Muon for parameters of rank >= 2: each parameter and its gradient are seen
    as a matrix (dim 0 by the rest, a view of the parameter, so the update lands in place).
    Orthogonalisation does not depend on the order of columns, so contiguous and
    channels-last kernels get the same update.

    `normalize_weights=True` rescales each parameter to Frobenius norm sqrt(dim 0) before its
    update (the airbench Muon procedure for conv filters followed by batch norm: the layer's
    function ignores the filters' scale, so fixing it makes the learning rate the size of each
    step relative to the weights, for the whole run).

    `ns_dtype` sets the precision of the Newton-Schulz iteration ('auto', 'bf16', 'fp32'; see
    the module docstring; 'auto' follows `precision`); with 'bf16' the update is torch.optim.Muon's.

    `foreach`, as in torch.optim: None (the default) uses multi-tensor kernels and batches the
    iteration over same-shape matrices when the parameters are on CUDA, and steps them one at a
    time elsewhere; True or False decide outright. The updates are the same either way (up to
    the rounding of batched products)."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients=(3.4445, -4.775, 2.0315), eps: float = 1e-7,
                 ns_steps: int = 5, adjust_lr_fn: str | None = None, normalize_weights: bool = False,
                 ns_dtype: str = "auto", precision: str = "fp32", foreach: bool | None = None):
        # resolved now (an unknown setting or rule is refused here rather than at the first step)
        ns_dtype = "bf16" if ns_dtype_for(ns_dtype, precision) == torch.bfloat16 else "fp32"
        _lr_ratio(adjust_lr_fn, 1, 1)
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn,
                        normalize_weights=normalize_weights, ns_dtype=ns_dtype, foreach=foreach)
        torch.optim.Optimizer.__init__(self, params, defaults)   # Muon's own check allows 2-D only
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim < 2:
                    raise ValueError(f"ConvMuon takes parameters of rank >= 2, got shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group.get("normalize_weights"):
                for p in group["params"]:
                    if p.grad is not None:
                        p.mul_(p.shape[0] ** 0.5 / p.norm().clamp_min(group["eps"]))
            params, grads, bufs = [], [], []
            self._init_group(group, params, grads, bufs)
            if not params:
                continue
            # each kernel and its gradient as (dim 0, rest) matrices: views, so updates land in place
            # (made here, not in _init_group: a compiled step must see them made from p and p.grad)
            grads = [g if is_dtensor(p) else _matrix(g, p) for p, g in zip(params, grads)]
            params = [p if is_dtensor(p) else _matrix(p, p) for p in params]
            lr, wd, mom = group["lr"], group["weight_decay"], group["momentum"]   # lr: a float, or a tensor (compiled steps)
            orthogonalise = lambda m: newton_schulz(m, group["ns_coefficients"], group["ns_steps"],  # noqa: E731
                                                    group["eps"], NS_DTYPES[group.get("ns_dtype", "fp32")])
            foreach = group.get("foreach")
            if foreach is None:   # torch.optim's rule: multi-tensor kernels on CUDA, a loop elsewhere
                foreach = params[0].is_cuda
            if not foreach or any(map(is_dtensor, params)):   # one parameter at a time (sharded: each update made whole)
                for p, g, buf in zip(params, grads, bufs):
                    buf.lerp_(g, 1 - mom)
                    update = g.lerp(buf, mom) if group["nesterov"] else buf
                    update = _whole_matrix_update(update, orthogonalise) if is_dtensor(p) else orthogonalise(update)
                    p.mul_(1 - lr * wd)
                    _descend(p, update, lr, _lr_ratio(group["adjust_lr_fn"], *p.shape))
                continue
            # foreach: the same update for all parameters at once, elementwise work as multi-tensor
            # kernels and the iteration batched over same-shape matrices: fewer launches on a GPU.
            # On a 2-core CPU the loop above was 7% faster (10.1 ms against 10.9 ms a step for
            # the CIFAR speedrun net's kernels, benchmarks/probes/muon_foreach_cost.py; 0.04% of a training step)
            torch._foreach_lerp_(bufs, grads, 1 - mom)
            updates = torch._foreach_lerp(grads, bufs, mom) if group["nesterov"] else bufs
            updates = orthogonalise_all(updates, orthogonalise)
            if wd:
                torch._foreach_mul_(params, 1 - lr * wd)
            for p, update in zip(params, updates):
                _descend(p, update, lr, _lr_ratio(group["adjust_lr_fn"], *p.shape))
        return loss

    def _init_group(self, group, params_with_grad, grads, muon_momentum_bufs):
        for p in group["params"]:
            if p.grad is None:
                continue
            if is_dtensor(p):   # sharded (FSDP): the momentum stays sharded; the update is made whole
                params_with_grad.append(p)
                grads.append(p.grad)
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                muon_momentum_bufs.append(state["momentum_buffer"])
                continue
            view = _matrix(p, p)
            if view.data_ptr() != p.data_ptr() or not view._is_view() and view is not p:
                raise RuntimeError("ConvMuon needs contiguous or channels-last parameters")
            params_with_grad.append(p)
            grads.append(p.grad)
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(_matrix(p.grad, p), memory_format=torch.preserve_format)
            muon_momentum_bufs.append(state["momentum_buffer"])
        return False


def muon_for(params: list[torch.Tensor], lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.0,
             adjust_lr_fn: str | None = None, ns_steps: int = 5, normalize_weights: bool = False,
             nesterov: bool = True, ns_dtype: str = "auto", precision: str = "fp32",
             foreach: bool | None = None, ns_coefficients=None) -> torch.optim.Optimizer:
    """torch.optim.Muon when every parameter is a matrix, no normalisation is asked, the
    iteration runs in bf16 and nothing is sharded; ConvMuon otherwise. Under FSDP ConvMuon
    gathers each sharded update explicitly (`_whole_matrix_update`, tested against one
    process). torch.optim.Muon in torch 2.13 also gives the right update on DTensor
    parameters (its matrix products redistribute the shards; a 16x16 layer sharded over two
    processes matched one process exactly), but hasten keeps to the path it tests."""
    kw = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, adjust_lr_fn=adjust_lr_fn, ns_steps=ns_steps,
              nesterov=nesterov)
    if ns_coefficients is not None:
        if len(ns_coefficients) != 3:
            raise ValueError(f"ns_coefficients: give the three coefficients (a, b, c), got {list(ns_coefficients)}")
        kw["ns_coefficients"] = tuple(float(c) for c in ns_coefficients)
    bf16 = ns_dtype_for(ns_dtype, precision) == torch.bfloat16
    if all(p.ndim == 2 for p in params) and not normalize_weights and bf16 and not any(map(is_dtensor, params)):
        opt = torch.optim.Muon(params, **kw)
    else:
        opt = ConvMuon(params, normalize_weights=normalize_weights, ns_dtype=ns_dtype, precision=precision,
                       foreach=foreach, **kw)
    opt.param_groups[0]["name"] = "muon"
    return opt


def muon_optimizers(model: torch.nn.Module, muon_lr: float = 0.02, muon_momentum: float = 0.95,
                    muon_weight_decay: float = 0.0, adam_lr: float = 3e-3, adam_betas=(0.9, 0.95),
                    adam_weight_decay: float = 0.0, exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
                    adjust_lr_fn: str | None = None, fused: bool | None = None,
                    ns_steps: int = 5, normalize_weights: bool = False,
                    ns_dtype: str = "auto", precision: str = "fp32",
                    foreach: bool | None = None, ns_coefficients=None) -> list[torch.optim.Optimizer]:
    """[Muon over the hidden matrices and conv kernels, AdamW over the rest]: parameters with two
    or more dimensions whose names match none of `exclude` (embeddings and heads by default) go
    to Muon (`muon_lr`, `muon_momentum`, `muon_weight_decay`, `ns_steps` Newton-Schulz
    iterations in `ns_dtype`), every other parameter to AdamW (`adam_lr`, `adam_betas`,
    `adam_weight_decay`). Give the list to the Trainer's `optimizers=`, or step both in a loop;
    a list without the Muon part when the model has no such matrices."""
    hidden, other = split_for_muon(model, exclude)
    opts = []
    if hidden:
        opts.append(muon_for([p for _, p in hidden], muon_lr, muon_momentum, muon_weight_decay, adjust_lr_fn,
                             ns_steps, normalize_weights, ns_dtype=ns_dtype, precision=precision, foreach=foreach,
                             ns_coefficients=ns_coefficients))
    if other:
        dev = other[0][1].device.type
        opts.append(torch.optim.AdamW([p for _, p in other], lr=adam_lr, betas=tuple(adam_betas),
                                      weight_decay=adam_weight_decay,
                                      fused=fused if fused is not None else dev in ("cpu", "cuda")))
        opts[-1].param_groups[0]["name"] = "adamw"
    return opts
