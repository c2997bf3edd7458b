"""Which rank loads what under data parallelism.

One rule at every world size: each step trains on one global batch (the batch size a recipe
or a loader states), and rank r trains on its contiguous share of it
(`hasten.data.batches.share_range`: the first `len % world_size` ranks one sample more), split into
its micro-batches. So one process and N processes see the same samples in the same step.
Who takes the share depends on the loader, decided once per loader by `prepare`:

- 'loader': hasten's loaders (DeviceLoader, RandomWindows, EvalWindows, and DataLoaders from
  `make_dataloader`) load only their rank's share; random augmentation is drawn for the
  whole global batch and sliced, so the shares are what one process would see;
- 'sampler': a DataLoader whose sampler is torch's DistributedSampler already yields this
  rank's batches; the global batch is taken as world_size times the rank's batch (the
  sampler makes the shares equal). Refused for evaluation: the sampler pads the last batch
  with repeated samples, which would be counted twice;
- 'trainer': any other iterable yields global batches; every rank loads the whole batch and
  the Trainer keeps the rank's share. Correct, but the loading is repeated on every rank.

`RankShare` does the accounting of one loader during a fit: each rank's share, the global
batch's size, and the weight of each rank's mean in the gradient average.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from .batches import batch_size, shard_batch


@dataclass(frozen=True)
class Sharding:
    mode: str                 # 'loader' | 'sampler' | 'trainer'
    source: object = None     # what answers global_batch_size(epoch, index) in 'loader' mode

    def global_size(self, epoch: int, index: int, local: int, world_size: int) -> int:
        """The size of global batch `index` of `epoch`, given this rank's share `local`."""
        if self.mode == "loader":
            return self.source.global_batch_size(epoch, index)
        return local * world_size   # 'sampler' ('trainer' reads the global batch itself)


def own_sharing(loader):
    """What in `loader` loads only a rank's share and says each global batch's size (hasten's
    loaders, or a DataLoader over hasten's batch sampler): the loader, its batch sampler, or None."""
    for source in (loader, getattr(loader, "batch_sampler", None)):
        if hasattr(source, "shard_for_rank"):
            return source
    return None


def _distributed_sampler(loader) -> bool:
    from torch.utils.data.distributed import DistributedSampler
    samplers = (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None))
    return any(isinstance(s, DistributedSampler) for s in samplers)


def prepare(loader, rank: int, world_size: int, purpose: str = "training") -> Sharding:
    """Decide how `loader` is shared among the ranks and make hasten's loaders load only
    rank `rank`'s part (idempotent)."""
    source = own_sharing(loader)
    if source is not None:
        source.shard_for_rank(rank, world_size)
        return Sharding("loader", source)
    if _distributed_sampler(loader):
        if purpose == "evaluation":
            raise ValueError("the evaluation loader uses a DistributedSampler, which repeats samples to make "
                             "the ranks' shares equal, so they would be counted twice: give the evaluation "
                             "loader unsharded; the Trainer shares each of its batches, counting every sample once")
        return Sharding("sampler")
    return Sharding("trainer")


def last_batch_size(loader, epoch: int = 0) -> int | None:
    """The size of the last global batch of an epoch of `loader`, where it can be known without
    loading it: hasten's loaders say it (`global_batch_size`), a DataLoader with a batch size
    and a sized sampler that keeps its last batch has the remainder; None otherwise (an
    iterable without a length). A compiled run warms up on it (a smaller last batch is a new
    shape)."""
    try:
        n = len(loader)
    except TypeError:
        return None
    if n < 1:
        return None
    if isinstance(loader, (list, tuple)):   # batches held in a list
        return batch_size(loader[-1])
    source = own_sharing(loader)
    if source is not None:
        return int(source.global_batch_size(epoch, n - 1))
    size, sampler = getattr(loader, "batch_size", None), getattr(loader, "sampler", None)
    if isinstance(size, int):
        if getattr(loader, "drop_last", False):
            return size
        try:
            return len(sampler) - (n - 1) * size
        except TypeError:
            return None
    return None


class RankShare:
    """Share accounting of one loader under data parallelism: this rank's share of each global
    batch, the global batch's size (`take`), the step's samples and tokens on all ranks, and
    the weight of this rank's mean in DDP's gradient average (`count`, `rank_scale`)."""

    def __init__(self, loader, world, purpose: str = "training"):
        self.rank, self.world_size = world.rank, world.size
        self.sharding = prepare(loader, world.rank, world.size, purpose)
        self.rank_scale = 1.0
        if self.sharding.mode == "trainer" and purpose == "training" and world.is_main:
            warnings.warn("the training loader yields whole global batches: every rank loads each batch and keeps "
                          "its share. To load only the share, use hasten.data.make_dataloader or DeviceLoader, or a "
                          "DistributedSampler with the per-rank batch size (docs/distributed.md)", stacklevel=4)

    @property
    def mode(self) -> str:
        return self.sharding.mode

    def take(self, batch, epoch: int, index: int) -> tuple:
        """(this rank's share of global batch `index` of `epoch`, the global batch's size); the
        loader may have taken the share already."""
        if self.sharding.mode == "trainer":
            return shard_batch(batch, self.rank, self.world_size), batch_size(batch)
        return batch, self.sharding.global_size(epoch, index, batch_size(batch), self.world_size)

    def count(self, n_samples: int, n_tokens: int, n: int) -> tuple[int, int]:
        """The step's samples and tokens on all ranks, given this rank's and the global batch's
        size `n` (an algorithm may have changed it since `take`): the clock counts the global
        batch, so durations mean the same at any world size; tokens are this rank's scaled to
        the global batch, exact for batches of equal-length sequences. Sets `rank_scale`, this
        rank's share of the global batch times the world size."""
        self.rank_scale = n_samples / n * self.world_size if n else 0.0
        return n, (n_tokens * n // n_samples if n_samples else 0)
