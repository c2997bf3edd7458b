"""Sharded data parallelism with PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`).

The ZeRO line of work in PyTorch's own form: parameters, gradients and optimizer state are
sharded across the ranks (each holds 1/world of every sharded tensor, a DTensor), parameters
are all-gathered one block at a time for the forward and backward passes, and gradients are
reduce-scattered. hasten writes no sharding of its own; this module decides what to shard
(`fsdp_blocks`), applies `fully_shard` with the runtime's precision (`shard_model`), and
moves whole-model state in and out of a sharded model for checkpoints (`model_state`,
`load_model_state`, `optimizer_state`, `load_optimizer_state`).

Blocks: each block is sharded as one unit (its parameters gathered together), then the root
takes what is left (embeddings, heads). The blocks are the modules named by
`trainer.fsdp.blocks` (name patterns such as `blocks.*`, or class names such as `Block`), else
the model's own `fsdp_blocks()` (hasten's GPT: its transformer blocks; the CIFAR and ImageNet
networks: their stages), else none (the whole model is one unit: memory at rest is still
sharded, but the forward gathers every parameter at once).

`reshard_after_forward`: True frees the gathered parameters after each block's forward and
gathers them again for its backward (ZeRO-3: least memory); False keeps them until the
backward (the ZeRO-2 style: one all-gather a step fewer, the whole model's parameters held
between forward and backward).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class FSDPOptions:
    """`trainer.fsdp`: sharded training (trainer.parallelism=fsdp, FSDP2; docs/distributed.md).
    The recipe section and the Trainer's `fsdp=` option are this one class."""
    reshard_after_forward: bool = True
    """true: free each block's gathered parameters after its forward (ZeRO-3, least memory); false: keep them for the backward (ZeRO-2 style)."""
    blocks: tuple[str, ...] = ()
    """Modules sharded as units: name patterns (blocks.*) or class names (Block); default: the model's fsdp_blocks()."""
    checkpoint: Literal["sharded", "whole"] = "sharded"
    """sharded: each rank writes its shards (a .dcp folder, torch.distributed.checkpoint); whole: gathered into one file by rank 0."""

    def __post_init__(self):
        if self.checkpoint not in ("sharded", "whole"):
            raise ValueError(f"fsdp checkpoint={self.checkpoint!r}: use 'sharded' or 'whole'")
        object.__setattr__(self, "blocks", tuple(self.blocks))   # a recipe gives a list

    @classmethod
    def of(cls, options: "FSDPOptions | dict | None") -> "FSDPOptions":
        """The options as given: an FSDPOptions, a dict of its fields, or None (the defaults)."""
        return options if isinstance(options, cls) else cls(**(options or {}))


def fsdp_blocks(model: nn.Module, patterns: tuple[str, ...] = ()) -> list[nn.Module]:
    """The modules sharded as units, in model order (see the module docstring)."""
    if patterns:
        found = [m for name, m in model.named_modules() if name and any(
            fnmatch.fnmatch(name, p) or type(m).__name__ == p for p in patterns)]
        if not found:
            raise ValueError(f"trainer.fsdp.blocks={list(patterns)} names no module of {type(model).__name__}: give "
                             "module name patterns (e.g. 'blocks.*') or class names (e.g. 'Block')")
        # a block inside another block is sharded with it
        return [m for m in found if not any(o is not m and any(c is m for c in o.modules()) for o in found)]
    if hasattr(model, "fsdp_blocks"):
        return list(model.fsdp_blocks())
    return []


def _checkpoint_activations(block: nn.Module) -> None:
    """Recompute the block's activations in the backward pass instead of keeping them."""
    if getattr(block, "_hasten_checkpointed", False):
        return
    forward = block.forward

    def checkpointed(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    block.forward = checkpointed
    block._hasten_checkpointed = True


def checkpoint_blocks(model: nn.Module, patterns: tuple[str, ...] = ()) -> int:
    """Activation checkpointing per block (trainer.activation_checkpointing): each block's
    activations are recomputed in the backward pass instead of kept, with or without FSDP. The
    blocks are the model's `fsdp_blocks()` (hasten's GPT, BERT, ViT and conv nets) or the
    modules `patterns` name (trainer.fsdp.blocks); a Hugging Face model behind hasten's adapter
    uses its own gradient checkpointing. Returns the number of blocks."""
    inner = getattr(model, "model", None)
    if not patterns and hasattr(inner, "gradient_checkpointing_enable") and getattr(inner, "supports_gradient_checkpointing", False):
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return 1
    blocks = fsdp_blocks(model, patterns)
    if not blocks:
        raise ValueError(f"activation_checkpointing: {type(model).__name__} names no blocks to recompute: give "
                         "trainer.fsdp.blocks (module name patterns such as 'layers.*', or class names), or an "
                         "fsdp_blocks() method on the model")
    for block in blocks:
        _checkpoint_activations(block)
    return len(blocks)


def mixed_precision(precision: str):
    """FSDP2's policy for the run's precision: bf16-mixed gathers and computes in bf16 and
    reduces gradients in fp32 (fp16-mixed likewise in fp16); fp32 needs no policy."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    dtype = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision)
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype is not None else None


def shard_model(model: nn.Module, device: torch.device, world_size: int, precision: str,
                options: FSDPOptions = FSDPOptions()) -> nn.Module:
    """Apply FSDP2's `fully_shard` to every block, then to the root, over a one-dimensional
    mesh of all ranks; returns the model (sharded in place)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(device.type, (world_size,))
    kw = {"mesh": mesh, "reshard_after_forward": options.reshard_after_forward}
    policy = mixed_precision(precision)
    if policy is not None:
        kw["mp_policy"] = policy
    for block in fsdp_blocks(model, options.blocks):
        fully_shard(block, **kw)   # activation checkpointing, when asked, was applied before (checkpoint_blocks)
    fully_shard(model, **kw)
    return model


# ---------------------------------------------------------------------------- whole-model state
def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, **kw)


def model_state(model: nn.Module) -> dict:
    """The whole model's state dict as ordinary tensors on the CPU, on rank 0 (other ranks get
    an empty dict). A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    return get_model_state_dict(model, options=_options(cpu_offload=True))


def load_model_state(model: nn.Module, state: dict) -> None:
    """Load a whole-model state dict (ordinary tensors, as `model_state` or one process wrote
    it) into a sharded model; every rank passes the same dict."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict
    set_model_state_dict(model, state, options=_options())


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's whole state, keyed by parameter names, on the CPU (rank 0). A collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    return get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    set_optimizer_state_dict(model, optimizer, state, options=_options())
