"""Batches: the batch contract (inputs, targets), moving nested batches to a device, and
splitting them into micro-batches and into the ranks' shares."""
from __future__ import annotations

import torch


def forward(model, inputs):
    """The one way hasten calls a model: keyword inputs for a dict (Hugging Face style),
    positional otherwise."""
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


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


def batch_size(batch) -> int:
    """The number of samples in a (nested) batch: the length of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, (list, tuple)):
        return batch_size(batch[0])
    if isinstance(batch, dict):
        return batch_size(next(iter(batch.values())))
    raise TypeError(f"cannot tell the batch size of a {type(batch).__name__}")


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


def map_samples(batch, fn):
    """`fn` applied to every tensor with a sample dimension of a (nested) batch; scalars and
    anything else kept as they are, lists kept lists and tuples tuples."""
    if isinstance(batch, torch.Tensor):
        return fn(batch) if batch.dim() else batch
    if isinstance(batch, (list, tuple)):
        out = [map_samples(b, fn) for b in batch]
        return out if isinstance(batch, list) else tuple(out)
    if isinstance(batch, dict):
        return {k: map_samples(v, fn) for k, v in batch.items()}
    return batch


def index_batch(batch, idx: torch.Tensor):
    """The samples `idx` (a LongTensor on the batch's device) of a (nested) batch."""
    return map_samples(batch, lambda t: t.index_select(0, idx.to(t.device)))


def cut(batch, n: int):
    """The first `n` samples of a (nested) batch (views, no copy)."""
    return map_samples(batch, lambda t: t[:n])


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
    def share(t):
        start, stop = share_range(t.shape[0], rank, world_size)
        return t[start:stop]
    return map_samples(batch, share)


def token_count(targets) -> int:
    """The default token count of a step's targets: every element of integer targets of two or
    more dimensions (a language model's (batch, time) ids), 0 for anything else."""
    if isinstance(targets, torch.Tensor) and targets.dim() >= 2 and not targets.is_floating_point():
        return targets.numel()
    return 0


def describe_inputs(x) -> str:
    """A batch's inputs in a few words, for messages: shape and dtype of a tensor, else its type."""
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} ({str(x.dtype).replace('torch.', '')})"
    return f"a {type(x).__name__}"


def check_images(x, who: str) -> None:
    """A ValueError naming `who` unless `x` is a batch of images (N, C, H, W) of floats."""
    if not (isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point()):
        raise ValueError(f"{who} needs batches of images (batch, channels, height, width) of floats; these inputs "
                         f"are {describe_inputs(x)}: remove {who} from the algorithms")
