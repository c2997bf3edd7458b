"""Sharded tensors (FSDP2's DTensors) seen from code that keeps state beside a model: the
local shard of a parameter, a whole tensor sharded like a live one, and state dicts gathered
whole. Nothing here imports torch.distributed until a DTensor is actually met."""
from __future__ import annotations

import torch


def is_dtensor(t) -> bool:
    """Whether `t` is a DTensor (a parameter sharded by FSDP), without importing torch.distributed."""
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local")


def local_tensors(tensors: list) -> list[torch.Tensor]:
    """Each tensor's local part: a sharded DTensor's shard on this rank (sharing its storage,
    so in-place updates write through), any other tensor itself. Element-wise state kept beside
    a sharded model (EMA, lookahead) is updated shard by shard with plain foreach ops."""
    return [t.to_local() if is_dtensor(t) else t for t in tensors]


def sharded_like(value: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """`value` (a whole tensor, e.g. loaded from a checkpoint) sharded as `live` is; `value`
    itself when `live` is not sharded or `value` already is."""
    if not is_dtensor(live) or is_dtensor(value):
        return value
    from torch.distributed.tensor import distribute_tensor
    return distribute_tensor(value.to(live.device, live.dtype), live.device_mesh, live.placements, src_data_rank=None)


def gather_whole(obj):
    """`obj` (a state dict, nested) with every sharded DTensor gathered into a whole tensor on
    the CPU: a collective when there are DTensors (every rank calls it with the same structure)."""
    if is_dtensor(obj):
        return obj.full_tensor().cpu()
    if isinstance(obj, dict):
        return {k: gather_whole(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(gather_whole(v) for v in obj)
    return obj


def gather_indexed(values: torch.Tensor, indices: torch.Tensor, world_size: int, pad_to: int,
                   spare: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's (value, sample index) pairs, for state kept per sample on every rank (the
    latest loss of each sample). One all-gather of a (2, pad_to) float64 block per rank: indices
    are exact in float64; a rank holding fewer than `pad_to` pairs pads with value 0 at index
    `spare` (a slot the caller keeps for it). Every rank calls it with the same `pad_to`.
    Returns (values as float32, indices as int64), world_size * pad_to of each."""
    n = values.shape[0]
    if pad_to < n:
        raise ValueError(f"pad_to={pad_to} is smaller than this rank's {n} samples")
    block = torch.empty(2, pad_to, dtype=torch.float64, device=values.device)
    block[0, :n], block[0, n:] = values, 0.0
    block[1, :n], block[1, n:] = indices.to(values.device), float(spare)
    every = torch.empty(world_size * 2, pad_to, dtype=torch.float64, device=values.device)
    import torch.distributed as dist   # all_gather_single: torch 2.13's name of all_gather_into_tensor
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(every, block)
    every = every.view(world_size, 2, pad_to)
    return every[:, 0].flatten().float(), every[:, 1].flatten().long()
