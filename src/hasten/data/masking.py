"""Masked-language-model batches: BERT's masking drawn on the fly from (seed, epoch, index), so
every epoch masks afresh, a resumed run masks as the straight one, and every rank's share is
the slice of one draw for the whole global batch.

`mask_tokens(ids, generator, rate, mask_id, vocab_size, ...)`: each token that is not special is
chosen with probability `rate`; a chosen token's target is its id (every other target the
ignore index, -100), and its input becomes the mask token (a share `mask_share`, 80% in BERT),
a random token (`random_share`, 10%), or stays (the rest).
"""
from __future__ import annotations

import torch

from ..loss import IGNORE_INDEX
from ..seeding import derive_seed
from .batches import share_range


def mask_tokens(ids: torch.Tensor, generator: torch.Generator, rate: float, mask_id: int, vocab_size: int,
                mask_share: float = 0.8, random_share: float = 0.1, special_ids: tuple = ()) -> tuple:
    """(inputs, targets) of a masked-LM batch of token ids (see the module docstring)."""
    chosen = torch.rand(ids.shape, generator=generator) < rate
    for s in special_ids:
        chosen &= ids != s
    targets = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    draw = torch.rand(ids.shape, generator=generator)
    random_ids = torch.randint(vocab_size, ids.shape, generator=generator)
    inputs = torch.where(chosen & (draw < mask_share), torch.full_like(ids, mask_id), ids)
    inputs = torch.where(chosen & (draw >= mask_share) & (draw < mask_share + random_share), random_ids, inputs)
    return inputs, targets


class MaskedWindows:
    """Training batches of `batch_size` random windows of `block_size` tokens, masked afresh
    each time (inputs, targets); with `segments`, inputs are {"idx", "segments"} so attention
    stays inside documents. Under data parallelism each rank yields its share of the draw."""

    def __init__(self, tokens, block_size: int, batch_size: int, mask: dict, seed: int = 0, segments=None,
                 eval_seed: int | None = None):
        self.tokens = torch.as_tensor(tokens).long()
        self.segments = None if segments is None else torch.as_tensor(segments).long()
        if len(self.tokens) <= block_size:
            raise ValueError(f"{len(self.tokens)} tokens: fewer than one window of {block_size}")
        self.block_size, self.batch_size, self.mask, self.seed = block_size, batch_size, mask, seed
        self._part = slice(None)

    def __len__(self) -> int:
        return max(1, len(self.tokens) // (self.batch_size * self.block_size))

    def shard_for_rank(self, rank: int, world_size: int) -> None:
        self._part = slice(*share_range(self.batch_size, rank, world_size))

    def global_batch_size(self, epoch: int, index: int) -> int:
        return self.batch_size

    def batch(self, epoch: int, index: int):
        g = torch.Generator().manual_seed(derive_seed(self.seed, epoch, index))
        starts = torch.randint(len(self.tokens) - self.block_size, (self.batch_size,), generator=g)
        idx = starts[:, None] + torch.arange(self.block_size)
        inputs, targets = mask_tokens(self.tokens[idx], g, **self.mask)
        inputs, targets, idx = inputs[self._part], targets[self._part], idx[self._part]
        if self.segments is not None:
            return {"idx": inputs, "segments": self.segments[idx]}, targets
        return inputs, targets

    def iter_epoch(self, epoch: int, skip_batches: int = 0):
        for i in range(skip_batches, len(self)):
            yield self.batch(epoch, i)

    def __iter__(self):
        return self.iter_epoch(0)


class MaskedEvalWindows:
    """Validation: the non-overlapping windows of `tokens` in order, masked with a fixed seed
    (the same positions at every evaluation and at any world size); each rank its share."""

    def __init__(self, tokens, block_size: int, batch_size: int, mask: dict, seed: int = 1234, segments=None):
        tokens = torch.as_tensor(tokens).long()
        n = len(tokens) // block_size
        if n < 1:
            raise ValueError(f"{len(tokens)} validation tokens: fewer than one window of {block_size}")
        self.x = tokens[: n * block_size].view(n, block_size)
        self.s = None if segments is None else torch.as_tensor(segments).long()[: n * block_size].view(n, block_size)
        self.batch_size, self.mask, self.seed = batch_size, mask, seed
        self.rank, self.world_size = 0, 1

    def __len__(self) -> int:
        return -(-len(self.x) // self.batch_size)

    def shard_for_rank(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = int(rank), int(world_size)

    def global_batch_size(self, epoch: int, index: int) -> int:
        return min(self.batch_size, len(self.x) - index * self.batch_size)

    def __iter__(self):
        for b, i in enumerate(range(0, len(self.x), self.batch_size)):
            x = self.x[i:i + self.batch_size]
            inputs, targets = mask_tokens(x, torch.Generator().manual_seed(derive_seed(self.seed, b)), **self.mask)
            start, stop = share_range(len(x), self.rank, self.world_size)
            inputs, targets = inputs[start:stop], targets[start:stop]
            if self.s is not None:
                yield {"idx": inputs, "segments": self.s[i + start:i + stop]}, targets
            else:
                yield inputs, targets
