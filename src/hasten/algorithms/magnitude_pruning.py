"""Magnitude pruning on `torch.nn.utils.prune`: global or per layer, unstructured.

    targets = prunable_weights(model)              # conv and linear weights, stem and head left dense
    global_magnitude_prune(model, 0.5)             # the 50% smallest |w| over all targets set to zero
    layer_magnitude_prune(model, 0.5)              # 50% of each target layer
    make_permanent(model)                          # fold the masks into the weights (before export)

While a mask is in place the layer holds `weight_orig` (a parameter) and `weight_mask` (a
buffer), and `weight = weight_orig * weight_mask` is recomputed before every forward, so
training on goes on with the pruned weights held at zero; the masks are part of the model's
`state_dict` and so of every checkpoint. Pruning an already pruned layer combines the masks
(torch's PruningContainer): the sparsity asked for is always the fraction of zeros after the
call, over the targets, counting those already pruned.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.utils.prune as prune

PRUNABLE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def check_sparsity(sparsity: float, what: str = "sparsity") -> float:
    """A fraction of weights to remove: 0 <= s < 1 (1 would remove every weight)."""
    try:
        s = float(sparsity)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number in [0, 1), got {sparsity!r}") from None
    if not 0.0 <= s < 1.0:
        raise ValueError(f"{what} must lie in [0, 1) (a fraction of the weights to remove), got {sparsity}")
    return s


def _embedding_weights(model: nn.Module) -> set[int]:
    return {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}


def prunable_weights(model: nn.Module, keep_dense: tuple[str, ...] | None = None) -> list[tuple[str, nn.Module]]:
    """The layers whose weights pruning removes, as (name, module): every Linear and Conv,
    except, by default, the first convolution that sees the input (the stem: few weights,
    every later layer depends on it), the last Linear (the classifier head) and any weight
    shared with an embedding (a tied language-model head). `keep_dense`: module names to
    leave dense instead of that default."""
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, PRUNABLE)]
    if keep_dense is None:
        dense = set()
        convs = [n for n, m in layers if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d))]
        linears = [n for n, m in layers if isinstance(m, nn.Linear)]
        if convs:
            dense.add(convs[0])
        if linears:
            dense.add(linears[-1])
    else:
        names = {n for n, _ in layers}
        unknown = [n for n in keep_dense if n not in names]
        if unknown:
            raise ValueError(f"keep_dense names {unknown}, which are not conv or linear layers of this model; "
                             f"they are: {sorted(names)[:8]}{' ...' if len(names) > 8 else ''}")
        dense = set(keep_dense)
    tied = _embedding_weights(model)
    return [(n, m) for n, m in layers if n not in dense and id(_weight(m)) not in tied]


def _weight(m: nn.Module) -> torch.Tensor:
    """The weight as the forward uses it (the product weight_orig * mask while pruned)."""
    return m.weight_orig if hasattr(m, "weight_orig") else m.weight


def _prune_to(model: nn.Module, sparsity: float, layers, scope: str) -> dict:
    """Masks (torch.nn.utils.prune's custom_from_mask) that remove the smallest |w| to reach
    `sparsity` over `layers` (default `prunable_weights(model)`), together or per layer;
    entries already masked stay masked. Computed on reshaped copies, so channels-last weights
    work too (torch's global_unstructured needs contiguous ones). Returns layer_sparsity."""
    s = check_sparsity(sparsity)
    layers = prunable_weights(model) if layers is None else layers
    if not layers:
        raise ValueError("this model has no conv or linear layers to prune")
    weights = [_weight(m).detach() for _, m in layers]
    old = [getattr(m, "weight_mask", None) for _, m in layers]
    old = [o if o is not None else torch.ones_like(w) for o, w in zip(old, weights)]
    for (_, m), mask in zip(layers, magnitude_masks(weights, old, s, scope)):
        if prune.is_pruned(m):
            prune.remove(m, "weight")   # fold the old mask (its zeros stay), then mask again
        prune.custom_from_mask(m, "weight", mask)
    return layer_sparsity(model, layers)


@torch.no_grad()
def magnitude_masks(weights: list[torch.Tensor], masks: list[torch.Tensor], sparsity: float,
                    scope: str = "global") -> list[torch.Tensor]:
    """New 0/1 masks keeping the largest |weight * mask| entries so that `sparsity` of all
    entries (global) or of each tensor (layer) are masked; entries already masked stay masked."""
    if scope == "layer":
        return [magnitude_masks([w], [m], sparsity)[0] for w, m in zip(weights, masks)]
    flat = torch.cat([(w * m).abs().reshape(-1).float() for w, m in zip(weights, masks)])
    k = int(round(sparsity * flat.numel()))
    keep = torch.ones_like(flat)
    if k > 0:
        keep[torch.topk(flat, k, largest=False, sorted=False).indices] = 0.0
    out, i = [], 0
    for w, m in zip(weights, masks):
        out.append(keep[i:i + w.numel()].view_as(w).to(m.dtype) * m)
        i += w.numel()
    return out


def global_magnitude_prune(model: nn.Module, sparsity: float, layers=None) -> dict:
    """Zero the `sparsity` fraction of smallest-magnitude weights over all `layers` together
    (default `prunable_weights(model)`): layers with many small weights lose more. The same
    masks as `torch.nn.utils.prune.global_unstructured` with L1Unstructured. Returns the
    sparsity reached per layer."""
    return _prune_to(model, sparsity, layers, "global")


def layer_magnitude_prune(model: nn.Module, sparsity: float, layers=None) -> dict:
    """Zero the `sparsity` fraction of smallest-magnitude weights of each layer on its own
    (torch's l1_unstructured per layer)."""
    return _prune_to(model, sparsity, layers, "layer")


def apply_masks(model: nn.Module, masks: dict[str, torch.Tensor]) -> None:
    """Put given masks (module name -> 0/1 tensor) on the model's layers (e.g. to keep a
    pruned model sparse while it is fine-tuned elsewhere)."""
    modules = dict(model.named_modules())
    for name, mask in masks.items():
        m = modules[name]
        prune.custom_from_mask(m, "weight", mask.to(_weight(m).device, _weight(m).dtype))


def masks(model: nn.Module) -> dict[str, torch.Tensor]:
    """The pruning masks in place, by module name."""
    return {n: m.weight_mask for n, m in model.named_modules() if hasattr(m, "weight_mask")}


def is_pruned(model: nn.Module) -> bool:
    """Whether any conv or linear layer of `model` carries a torch.nn.utils.prune mask."""
    return any(prune.is_pruned(m) for m in model.modules() if isinstance(m, PRUNABLE))


def make_permanent(model: nn.Module) -> nn.Module:
    """Fold every mask into its weight (`torch.nn.utils.prune.remove`): the layers hold plain
    weights again, with the zeros in them, and the state dict has its usual keys."""
    for m in model.modules():
        if isinstance(m, PRUNABLE) and prune.is_pruned(m):
            prune.remove(m, "weight")
    return model


def layer_sparsity(model: nn.Module, layers=None) -> dict[str, float]:
    """Fraction of zero weights per layer (masked or plain zeros), by module name."""
    layers = prunable_weights(model) if layers is None else layers
    out = {}
    for name, m in layers:
        w = m.weight.detach()
        out[name] = float((w == 0).sum()) / w.numel()
    return out


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(parameters, non-zero parameters) of the model as it computes: a pruned layer counts
    its masked weight, shared tensors count once."""
    seen, total, nonzero = set(), 0, 0
    for m in model.modules():
        for name, p in m.named_parameters(recurse=False):
            if name == "weight_orig":
                p = m.weight
            if id(p) in seen:
                continue
            seen.add(id(p))
            t = _plain(p.detach())
            total += t.numel()
            nonzero += int((t != 0).sum())
    return total, nonzero


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A quantized tensor subclass (torchao) as floats, for counting."""
    if type(t) is torch.Tensor or type(t) is nn.Parameter:
        return t
    try:
        return t.dequantize()
    except Exception:
        return t


__all__ = ["PRUNABLE", "apply_masks", "check_sparsity", "count_parameters", "global_magnitude_prune", "is_pruned",
           "layer_magnitude_prune", "layer_sparsity", "magnitude_masks", "make_permanent", "masks", "prunable_weights"]
