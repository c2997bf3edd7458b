"""Small helpers shared by the trainer and the data code: seeding, devices, batches."""
from __future__ import annotations

import functools
import hashlib
import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (seed, epoch, index, ...), stable across processes."""
    h = hashlib.blake2b(repr(tuple(int(p) for p in parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 1


def resolve_device(device: "str | torch.device") -> torch.device:
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"unknown device {device!r}: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'") from e


@functools.cache
def cpu_flags() -> frozenset:
    """The CPU's feature flags as Linux reports them (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("flags"):
                    return frozenset(ln.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo; the platform's word for it elsewhere)."""
    import platform
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
        if name:
            return name
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_has_bf16(flags: frozenset | None = None) -> bool:
    """Whether the CPU computes bf16 in hardware (AVX512-BF16 or AMX); others emulate it,
    several times slower than fp32. `flags` stands in for this CPU's, for tests."""
    return bool((cpu_flags() if flags is None else flags) & BF16_CPU_FLAGS)


def resolve_precision(precision: str, device: torch.device, flags: frozenset | None = None) -> str:
    """'auto' becomes the fastest precision the device runs natively: bf16-mixed on CUDA GPUs
    with bf16 (fp16-mixed on older ones) and on CPUs with AVX512-BF16 or AMX, fp32 elsewhere.
    Without bf16 hardware a CPU emulates bf16 and runs convolutions several times slower
    than in fp32. Other values pass through."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "fp16-mixed"
    if device.type == "cpu" and cpu_has_bf16(flags):
        return "bf16-mixed"
    return "fp32"


def forward(model, inputs):
    """The one way hasten calls a model: keyword inputs for a dict (Hugging Face style),
    positional otherwise."""
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def to_device(batch, device: torch.device):
    """Move every tensor in a (nested) batch to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        moved = [to_device(b, device) for b in batch]
        return type(batch)(moved) if isinstance(batch, list) else tuple(moved)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def split_batch(batch, n: int) -> list:
    """Split a (nested) batch into n micro-batches along dim 0."""
    if isinstance(batch, torch.Tensor):
        return list(torch.tensor_split(batch, n))
    if isinstance(batch, (list, tuple)):
        parts = [split_batch(b, n) for b in batch]
        return [tuple(p[i] for p in parts) for i in range(n)]
    if isinstance(batch, dict):
        parts = {k: split_batch(v, n) for k, v in batch.items()}
        return [{k: v[i] for k, v in parts.items()} for i in range(n)]
    return [batch] * n


def share_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """The positions [start, stop) of rank `rank`'s share of `n` samples: `world_size`
    contiguous parts, the first `n % world_size` one sample longer (torch.tensor_split's rule).
    The one rule by which a global batch is shared, whether the Trainer shares it
    (`shard_batch`) or a loader loads only its rank's part."""
    q, r = divmod(int(n), int(world_size))
    start = rank * q + min(rank, r)
    return start, start + q + (rank < r)


def shard_batch(batch, rank: int, world_size: int):
    """Rank `rank`'s share of a (nested) batch of the whole world (`share_range`'s rule), so
    every sample goes to exactly one rank and a batch that does not divide by the world size
    loses nothing."""
    if isinstance(batch, torch.Tensor):
        if not batch.dim():
            return batch
        start, stop = share_range(batch.shape[0], rank, world_size)
        return batch[start:stop]
    if isinstance(batch, (list, tuple)):
        parts = [shard_batch(b, rank, world_size) for b in batch]
        return parts if isinstance(batch, list) else tuple(parts)
    if isinstance(batch, dict):
        return {k: shard_batch(v, rank, world_size) for k, v in batch.items()}
    return batch


def batch_size(batch) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, (list, tuple)):
        return batch_size(batch[0])
    if isinstance(batch, dict):
        return batch_size(next(iter(batch.values())))
    raise TypeError(f"cannot tell the batch size of a {type(batch).__name__}")


def inputs_targets(batch):
    """The default batch contract: (inputs, targets), or a dict with 'input' and 'target'."""
    if isinstance(batch, (list, tuple)):
        return batch[0], (batch[1] if len(batch) > 1 else None)
    if isinstance(batch, dict):
        try:
            return batch["input"], batch.get("target")
        except KeyError:
            raise KeyError("a dict batch needs an 'input' key (and a 'target' key for training); "
                           f"got keys {sorted(batch)}. Pass batch_fn= to the Trainer for other layouts.") from None
    return batch, None


def index_batch(batch, idx: torch.Tensor):
    """The samples `idx` (a LongTensor on the batch's device) of a (nested) batch."""
    if isinstance(batch, torch.Tensor):
        return batch.index_select(0, idx.to(batch.device)) if batch.dim() else batch
    if isinstance(batch, (list, tuple)):
        out = [index_batch(b, idx) for b in batch]
        return out if isinstance(batch, list) else tuple(out)
    if isinstance(batch, dict):
        return {k: index_batch(v, idx) for k, v in batch.items()}
    return batch


# ---------------------------------------------------------------------------- sharded tensors (FSDP)
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
