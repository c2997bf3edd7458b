"""Structured pruning that shrinks tensors: the result is an ordinary, smaller model of the
same class with a smaller config, faster on any hardware (no sparse kernels needed).

- `SpeedrunNet` (the CIFAR speedrun networks): output channels of both convolutions of each
  conv group, with their batch norm and the next layer's input channels (the next group's
  first convolution, or the head); `widths` shrinks.
- transformers built from hasten's blocks (`GPT`, `BERT` and `BertClassifier`, `ViT`): MLP hidden
  units (rows of `fc`, both halves for a gated MLP, columns of `proj`; `mlp_hidden` shrinks) and
  whole attention heads (their query, key and value rows and their columns of the output
  projection; `n_head` shrinks, `head_dim` stays).

Which units go: the least important `ratio` of each layer, the same count in every layer of a
kind (a config has one width per group, one MLP width and one head count). How many stay:
`multiple_of` (default 16) rounds the kept count of a layer of at least 4 x `multiple_of`
units to the nearest multiple of it, because CPU and GPU kernels run such widths fastest
(cifar10-fast's widths 64/256/256 at 30%: 48/176/176, whose bf16 training step ran 1.16x as
fast as that of the exact 45/179/179 on a 2-core AVX512-BF16 EPYC,
benchmarks/probes/pruned_widths_cost.py); smaller layers, attention
heads, and `multiple_of=1` keep exactly round(units x (1 - ratio)). A unit's
importance is what it sends on: the mean magnitude of its activation over calibration inputs
(`inputs`) times the norm of the next layer's weights that read it. Without inputs, the
activation term is estimated from weights alone (batch-norm scale and shift; for the GPT the
norm of the unit's input weights), which is cruder: give a few batches of real data.

    small, changes = prune_structured(model, 0.3, inputs=batch)   # changes: {"widths": [48, 176, 176]}

ResNets are not supported: their residual connections tie channels across blocks (say so).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from dataclasses import replace

from ..data.batches import forward
from ..models.bert import BERT, BertClassifier
from ..models.gpt import GPT
from ..models.speedrun import ACTIVATIONS, ConvGroup, SpeedrunNet
from ..models.vit import ViT
from ..algorithms.magnitude_pruning import check_sparsity, is_pruned


@torch.no_grad()
def _observe(model: nn.Module, inputs, hooks: list) -> None:
    """One forward of `inputs` in eval mode with forward `hooks` (handles) in place; the
    hooks are removed and the model's mode restored afterwards."""
    was = model.training
    model.eval()
    try:
        forward(model, inputs)
    finally:
        model.train(was)
        for h in hooks:
            h.remove()


MULTIPLE_OF = 16


def check_multiple(multiple_of, name: str = "multiple_of") -> int:
    """`multiple_of` when it is a whole number >= 1; else ValueError naming `name`."""
    if not isinstance(multiple_of, int) or isinstance(multiple_of, bool) or multiple_of < 1:
        raise ValueError(f"{name}={multiple_of!r}: a whole number >= 1 (1 keeps exactly the fraction)")
    return multiple_of


def kept(n: int, ratio: float, multiple_of: int = 1) -> int:
    """Units kept of n when the `ratio` fraction is removed (at least one). With `multiple_of`
    > 1 and n >= 4 x `multiple_of`: the multiple of it nearest to n x (1 - ratio), at least one
    multiple, and one multiple fewer than n when rounding would remove nothing."""
    check_multiple(multiple_of)
    exact = n * (1.0 - ratio)
    if multiple_of == 1 or n < 4 * multiple_of:
        return max(1, int(round(exact)))
    k = max(multiple_of, multiple_of * int(round(exact / multiple_of)))
    return n - multiple_of if ratio > 0 and k >= n else k


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores, in their original order (ties: the lower index)."""
    order = torch.sort(scores.double(), descending=True, stable=True).indices[:k]
    return order.sort().values


# ---------------------------------------------------------------------------- speedrun net
def _speedrun_layers(model: SpeedrunNet):
    for g in model.groups:
        if not (isinstance(g, ConvGroup) and isinstance(g[0], nn.Conv2d) and isinstance(g[2], nn.BatchNorm2d)
                and isinstance(g[4], nn.Conv2d) and isinstance(g[5], nn.BatchNorm2d)):
            raise ValueError("structured pruning: this SpeedrunNet's conv groups were changed by model surgery "
                             "(expected conv, pool, batch norm, act, conv, batch norm, act); prune the plain network")
    return list(model.groups)


def _speedrun_activations(model: SpeedrunNet, inputs: torch.Tensor | None) -> list[torch.Tensor] | None:
    """Mean |activation| per channel after each group's two activations (six vectors)."""
    if inputs is None:
        return None
    acts = []
    _observe(model, inputs, [g[i].register_forward_hook(lambda m, a, out: acts.append(out.float().abs().mean((0, 2, 3))))
                             for g in model.groups for i in (3, 6)])
    return acts


def speedrun_channel_scores(model: SpeedrunNet, inputs: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Importance of every output channel of every conv in the groups (six vectors: group 0
    conv 1, group 0 conv 2, ...)."""
    groups = _speedrun_layers(model)
    acts = _speedrun_activations(model, inputs)
    consumers = []
    for gi, g in enumerate(groups):
        consumers.append(g[4].weight)   # conv 1's channels are read by conv 2
        consumers.append(groups[gi + 1][0].weight if gi + 1 < len(groups) else model.head.weight)
    bns = [bn for g in groups for bn in (g[2], g[5])]
    scores = []
    for i, (w, bn) in enumerate(zip(consumers, bns)):
        reads = w.detach().float().transpose(0, 1).reshape(w.shape[1], -1).norm(dim=1)
        if acts is not None:
            sends = acts[i]
        else:
            gamma = bn.weight.detach().float().abs() if bn.weight is not None else torch.ones_like(reads)
            beta = bn.bias.detach().float().abs() if bn.bias is not None else torch.zeros_like(reads)
            sends = gamma + beta
        scores.append(reads * sends)
    return scores


def speedrun_args(model: SpeedrunNet) -> dict:
    """Constructor arguments that rebuild a network shaped like `model` (read off its modules)."""
    g0 = model.groups[0]
    act = type(g0[3])
    name = next((k for k, v in ACTIVATIONS.items() if v is act), None)
    if name is None:
        raise ValueError(f"structured pruning: unknown activation {act.__name__} in the SpeedrunNet")
    return {"num_classes": model.head.out_features, "widths": [g[0].out_channels for g in model.groups],
            "whiten_kernel": model.whiten.kernel_size[0], "in_channels": model.whiten.in_channels, "act": name,
            "logit_scale": model.logit_scale, "bn_momentum": g0[2].momentum, "bn_eps": g0[2].eps}


def _bn_slice(sd: dict, prefix: str, keep: torch.Tensor) -> None:
    for k in ("weight", "bias", "running_mean", "running_var"):
        if prefix + k in sd:
            sd[prefix + k] = sd[prefix + k][keep]


def speedrun_plan(model: SpeedrunNet, ratio: float, inputs: torch.Tensor | None = None,
                  multiple_of: int = MULTIPLE_OF) -> tuple[dict, dict]:
    """(the pruned network's state dict, the config changes) for removing `ratio` of the
    channels of every conv in the groups (the kept count rounded by `kept`)."""
    ratio = check_sparsity(ratio, "structured ratio")
    groups = _speedrun_layers(model)
    scores = speedrun_channel_scores(model, inputs)
    widths = [kept(g[0].out_channels, ratio, multiple_of) for g in groups]
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for gi, g in enumerate(groups):
        p = f"groups.{gi}."
        k1 = _top(scores[2 * gi], widths[gi])
        k2 = _top(scores[2 * gi + 1], widths[gi])
        sd[p + "0.weight"] = sd[p + "0.weight"][k1]
        _bn_slice(sd, p + "2.", k1)
        sd[p + "4.weight"] = sd[p + "4.weight"][k2][:, k1]
        _bn_slice(sd, p + "5.", k2)
        if gi + 1 < len(groups):
            q = f"groups.{gi + 1}.0.weight"
            sd[q] = sd[q][:, k2]
        else:
            sd["head.weight"] = sd["head.weight"][:, k2]
    return sd, {"widths": widths}


# ---------------------------------------------------------------------------- transformers
def blocks_of(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """(state-dict prefix, blocks) of a transformer built from hasten's blocks, or None."""
    if isinstance(model, (GPT, ViT)):
        return "blocks.", model.blocks
    if isinstance(model, (BERT, BertClassifier)):
        return "encoder.blocks.", model.encoder.blocks
    return None


def _block_activations(blocks, model: nn.Module, inputs):
    """Per block: mean |MLP hidden activation| per unit, and mean norm of each head's output."""
    if inputs is None:
        return None
    mlp, heads, hooks = [], [], []

    def on_mlp_proj(m, a, out):
        mlp.append(a[0].float().abs().mean(dim=tuple(range(a[0].dim() - 1))))

    for b in blocks:
        hooks.append(b.mlp.proj.register_forward_hook(on_mlp_proj))
        attn = b.attn

        def on_attn_proj(m, a, out, attn=attn):
            y = a[0].float()
            heads.append(y.reshape(*y.shape[:-1], attn.n_head, attn.head_dim).norm(dim=-1).mean(dim=tuple(range(y.dim() - 1))))

        hooks.append(attn.proj.register_forward_hook(on_attn_proj))
    _observe(model, inputs, hooks)
    return mlp, heads


def transformer_unit_scores(model: nn.Module, inputs=None) -> tuple[list, list]:
    """(MLP hidden-unit importance per block, head importance per block)."""
    _, blocks = blocks_of(model)
    acts = _block_activations(blocks, model, inputs)
    mlp_scores, head_scores = [], []
    for i, b in enumerate(blocks):
        a = b.attn
        hidden = b.mlp.proj.weight.shape[1]
        reads = b.mlp.proj.weight.detach().float().norm(dim=0)
        fc = b.mlp.fc.weight.detach().float()
        sends = acts[0][i] if acts else fc[:hidden].norm(dim=1) * (fc[hidden:].norm(dim=1) if len(fc) > hidden else 1.0)
        mlp_scores.append(reads * sends)
        pw = b.attn.proj.weight.detach().float().reshape(-1, a.n_head, a.head_dim)
        reads_h = pw.pow(2).sum(dim=(0, 2)).sqrt()
        if acts:
            sends_h = acts[1][i]
        else:
            v = b.attn.qkv.weight.detach().float()[2 * a.n_head * a.head_dim:].reshape(a.n_head, -1)
            sends_h = v.norm(dim=1)
        head_scores.append(reads_h * sends_h)
    return mlp_scores, head_scores




def transformer_plan(model: nn.Module, ratio: float, inputs=None, mlp: bool = True,
                     heads: bool = True, multiple_of: int = MULTIPLE_OF) -> tuple[dict, dict]:
    """(the pruned model's state dict, the config changes) for removing `ratio` of the MLP
    hidden units (their count rounded by `kept`) and of the attention heads of every block."""
    ratio = check_sparsity(ratio, "structured ratio")
    prefix, blocks = blocks_of(model)
    first = blocks[0]
    n_head0, hd = first.attn.n_head, first.attn.head_dim
    hidden0 = first.mlp.proj.weight.shape[1]
    gated = first.mlp.fc.weight.shape[0] == 2 * hidden0
    mlp_scores, head_scores = transformer_unit_scores(model, inputs)
    hidden = kept(hidden0, ratio, multiple_of) if mlp else hidden0
    n_head = kept(n_head0, ratio) if heads else n_head0
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for i in range(len(blocks)):
        p = f"{prefix}{i}."
        if mlp:
            keep = _top(mlp_scores[i], hidden)
            rows = torch.cat([keep, keep + hidden0]) if gated else keep   # a gated MLP: both halves
            sd[p + "mlp.fc.weight"] = sd[p + "mlp.fc.weight"][rows]
            if p + "mlp.fc.bias" in sd:
                sd[p + "mlp.fc.bias"] = sd[p + "mlp.fc.bias"][rows]
            sd[p + "mlp.proj.weight"] = sd[p + "mlp.proj.weight"][:, keep]
        if heads:
            keep_h = _top(head_scores[i], n_head)
            cols = (keep_h[:, None] * hd + torch.arange(hd)[None, :]).reshape(-1)
            rows = torch.cat([part * n_head0 * hd + cols for part in range(3)])
            sd[p + "attn.qkv.weight"] = sd[p + "attn.qkv.weight"][rows]
            if p + "attn.qkv.bias" in sd:
                sd[p + "attn.qkv.bias"] = sd[p + "attn.qkv.bias"][rows]
            sd[p + "attn.proj.weight"] = sd[p + "attn.proj.weight"][:, cols]
    changes = {}
    if mlp:
        changes["mlp_hidden"] = hidden
    if heads:
        changes.update(n_head=n_head, head_dim=hd)
    return sd, changes




# ---------------------------------------------------------------------------- one entry point
def structured_plan(model: nn.Module, ratio: float, inputs=None, multiple_of: int = MULTIPLE_OF) -> tuple[dict, dict]:
    """(state dict, config changes) of `model` with `ratio` of its units removed (the kept
    counts rounded to multiples of `multiple_of` in layers large enough: `kept`)."""
    if is_pruned(model):
        raise ValueError("structured pruning needs plain weights: fold unstructured masks first "
                         "(hasten.compress.make_permanent), or prune structurally before")
    if isinstance(model, SpeedrunNet):
        return speedrun_plan(model, ratio, inputs, multiple_of)
    if blocks_of(model) is not None:
        if isinstance(model, ViT):
            raise ValueError("structured pruning of a ViT is not supported yet (its model section has no head or MLP "
                             "width to shrink); use unstructured pruning (--prune) or int8 (--quantize int8)")
        return transformer_plan(model, ratio, inputs, multiple_of=multiple_of)
    raise ValueError(f"structured pruning supports hasten's SpeedrunNet, GPT and BERT, not {type(model).__name__} "
                     "(in a ResNet the residual connections tie channels across blocks); use unstructured "
                     "pruning (--prune) for it")


def _carry_flags(old: nn.Module, new: nn.Module) -> None:
    """Frozen parameters stay frozen, learning-rate tags and channels-last layouts stay."""
    olds = dict(old.named_parameters())
    for name, p in new.named_parameters():
        o = olds.get(name)
        if o is not None:
            p.requires_grad_(o.requires_grad)
            if hasattr(o, "lr_mult"):
                p.lr_mult = o.lr_mult
            if o.dim() == 4 and o.is_contiguous(memory_format=torch.channels_last) and not o.is_contiguous():
                p.data = p.data.contiguous(memory_format=torch.channels_last)


def prune_structured(model: nn.Module, ratio: float, inputs=None,
                     multiple_of: int = MULTIPLE_OF) -> tuple[nn.Module, dict]:
    """A smaller model of the same class with `ratio` of its channels (SpeedrunNet) or MLP
    units and heads (GPT) removed, and the config changes that describe it (the kept counts
    rounded to multiples of `multiple_of` where a layer is large enough: `kept`). `model` is
    left as it was."""
    sd, changes = structured_plan(model, ratio, inputs, multiple_of)
    if isinstance(model, SpeedrunNet):
        small = SpeedrunNet(**{**speedrun_args(model), **changes})
    elif isinstance(model, BertClassifier):
        small = BertClassifier(replace(model.config, **changes), num_classes=model.head.out_features, pool=model.pool,
                               pad_id=model.pad_id)
    else:
        small = type(model)(replace(model.config, **changes))
    small.load_state_dict(sd)
    _carry_flags(model, small)
    dev = next(model.parameters()).device
    small.train(model.training)
    return small.to(dev), changes


__all__ = ["MULTIPLE_OF", "blocks_of", "kept", "prune_structured", "speedrun_args",
           "speedrun_channel_scores", "speedrun_plan", "structured_plan", "transformer_plan", "transformer_unit_scores"]
