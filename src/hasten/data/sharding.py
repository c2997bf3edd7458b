"""Which rank loads what under data parallelism.

One rule at every world size: each step trains on one global batch (the batch size a recipe
or a loader states), and rank r trains on its contiguous share of it
(`hasten.utils.share_range`: the first `len % world_size` ranks one sample more), split into
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
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sharding:
    mode: str                 # 'loader' | 'sampler' | 'trainer'
    source: object = None     # what answers global_batch_size(epoch, index) in 'loader' mode

    def global_size(self, epoch: int, index: int, local: int, world_size: int) -> int:
        """The size of global batch `index` of `epoch`, given this rank's share `local`."""
        if self.mode == "loader":
            return self.source.global_batch_size(epoch, index)
        return local * world_size   # 'sampler' ('trainer' reads the global batch itself)


def _distributed_sampler(loader) -> bool:
    from torch.utils.data.distributed import DistributedSampler
    samplers = (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None))
    return any(isinstance(s, DistributedSampler) for s in samplers)


def prepare(loader, rank: int, world_size: int, purpose: str = "training") -> Sharding:
    """Decide how `loader` is shared among the ranks and make hasten's loaders load only
    rank `rank`'s part (idempotent)."""
    for source in (loader, getattr(loader, "batch_sampler", None)):
        if hasattr(source, "shard_for_rank"):
            source.shard_for_rank(rank, world_size)
            return Sharding("loader", source)
    if _distributed_sampler(loader):
        if purpose == "evaluation":
            raise ValueError("the evaluation loader uses a DistributedSampler, which repeats samples to make "
                             "the ranks' shares equal, so they would be counted twice: give the evaluation "
                             "loader unsharded; the Trainer shares each of its batches, counting every sample once")
        return Sharding("sampler")
    return Sharding("trainer")
