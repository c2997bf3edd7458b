"""Reproducible, resumable data order.

Randomness in the data pipeline is derived from (seed, epoch, sample index), never from
the history of a global generator, so that an epoch's batches are the same whatever the
number of DataLoader workers, and a run resumed from the middle of an epoch sees exactly
the batches the uninterrupted run saw.

- `ResumableSampler`: a per-epoch permutation from (seed, epoch) that can start part-way.
- `ResumableBatchSampler`: its samples in global batches; under data parallelism each rank
  takes only its share of every batch (so DataLoader workers load only that share).
- `TransformDataset`: applies a random transform with a generator seeded by
  (seed, epoch, index): augmentation that survives resume and any worker count.
- `epoch_iterator`: how the Trainer starts an epoch on any iterable.
"""
from __future__ import annotations

import itertools
import random
import warnings
from typing import Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..seeding import derive_seed, seed_host_generators
from .batches import index_batch, share_range


def epoch_order(num_samples: int, chosen: torch.Tensor | None, shuffle: bool, seed: int, epoch: int,
                device: "torch.device | str" = "cpu", rank: int = 0, world_size: int = 1) -> torch.Tensor:
    """The sample indices of `epoch`: all `num_samples`, or only `chosen`, in an order drawn
    from (seed, epoch) on `device` when shuffling; with world_size > 1, this rank's equal share."""
    n = len(chosen) if chosen is not None else num_samples
    if shuffle:
        g = torch.Generator(device=device).manual_seed(derive_seed(seed, epoch))
        perm = torch.randperm(n, device=device, generator=g)
    else:
        perm = torch.arange(n, device=device)
    order = chosen.to(perm.device)[perm] if chosen is not None else perm
    if world_size > 1:
        order = order[rank::world_size][:n // world_size]
    return order


SHARD_WINDOW = 4
"""How many consecutive shards (after shuffling them) have their rows shuffled together: a
reader keeps that many shards decoded (hasten.data.streaming.StreamSplit), so each is decoded
once an epoch."""


def shard_local_order(blocks: list[int], seed: int, epoch: int, window: int = SHARD_WINDOW) -> torch.Tensor:
    """A permutation of all rows of `blocks` (shard sizes, in manifest order) drawn from
    (seed, epoch): the shards shuffled, then the rows of each group of `window` consecutive
    shards shuffled together."""
    g = torch.Generator().manual_seed(derive_seed(seed, epoch, 0x5AD))
    starts = np.concatenate([[0], np.cumsum(blocks)[:-1]]).tolist()
    shards = torch.randperm(len(blocks), generator=g).tolist()
    parts = []
    for i in range(0, len(shards), window):
        rows = torch.cat([torch.arange(starts[s], starts[s] + blocks[s]) for s in shards[i:i + window]])
        parts.append(rows[torch.randperm(len(rows), generator=g)])
    return torch.cat(parts)


class ResumableSampler(Sampler):
    """Shuffles with a permutation drawn from (seed, epoch); `set_epoch(epoch, skip)` starts
    the epoch `skip` samples in. With keyed=True it yields (epoch, index) keys for a
    TransformDataset, so per-sample augmentation knows its epoch inside worker processes."""

    def __init__(self, num_samples: int, shuffle: bool = True, seed: int = 0, keyed: bool = False,
                 blocks: "list[int] | None" = None):
        self.num_samples, self.shuffle, self.seed, self.keyed = int(num_samples), shuffle, seed, keyed
        self.epoch, self.skip = 0, 0
        self.selector = None   # optional: restricts an epoch to selector.indices() (see InfoBatch)
        self.blocks = blocks   # optional: the samples' shards, shuffled shard-locally (shard_local_order)
        if blocks is not None and sum(blocks) != self.num_samples:
            raise ValueError(f"blocks hold {sum(blocks)} samples, not {self.num_samples}")

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = int(epoch), int(skip)

    def order(self, epoch: int) -> torch.Tensor:
        chosen = self.selector.indices() if self.selector is not None else None
        if self.blocks is not None and self.shuffle:
            order = shard_local_order(self.blocks, self.seed, epoch)
            if chosen is not None:   # a selection (InfoBatch) keeps the shard-local order of what it keeps
                keep = torch.zeros(self.num_samples, dtype=torch.bool)
                keep[chosen] = True
                order = order[keep[order]]
            return order
        return epoch_order(self.num_samples, chosen, self.shuffle, self.seed, epoch)

    def __iter__(self) -> Iterator:
        idx = self.order(self.epoch)[self.skip:].tolist()
        if self.keyed:
            epoch = self.epoch
            return iter([(epoch, i) for i in idx])
        return iter(idx)

    def __len__(self) -> int:
        if self.selector is not None and self.selector.indices() is not None:
            return self.selector.count
        return self.num_samples


class EmptyShare:
    """A rank's share of a global batch with fewer samples than ranks: nothing. A DataLoader
    cannot fetch an empty batch, so the batch sampler asks for the global batch's first sample
    wrapped in this, and `collate_shares` returns a batch of no samples shaped like it (the
    rank then takes part in the step's gradient all-reduce with a zero gradient)."""
    __slots__ = ("key",)

    def __init__(self, key):
        self.key = key


def collate_shares(items: list):
    """torch's default collation, and a batch of no samples for an EmptyShare."""
    from torch.utils.data import default_collate
    if len(items) == 1 and isinstance(items[0], EmptyShare):
        return index_batch(default_collate([items[0].key]), torch.zeros(0, dtype=torch.long))
    return default_collate(items)


class ResumableBatchSampler(Sampler):
    """Batches of `batch_size` keys of a ResumableSampler (the DataLoader's `batch_sampler`,
    as `make_dataloader` builds it). Every batch is a global batch; after
    `shard_for_rank(rank, world_size)` (the Trainer calls it under data parallelism) it yields
    only rank `rank`'s share of each (`hasten.data.batches.share_range`), so every rank walks the same
    batches and its workers load only its share."""

    def __init__(self, sampler: ResumableSampler, batch_size: int, drop_last: bool = False):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
        self.rank, self.world_size = 0, 1

    def shard_for_rank(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = int(rank), int(world_size)

    def global_batch_size(self, epoch: int, index: int) -> int:
        return min(self.batch_size, len(self.sampler) - index * self.batch_size)

    def __iter__(self) -> Iterator:
        keys, b = list(self.sampler), self.batch_size
        stop = len(keys) // b * b if self.drop_last else len(keys)
        for start in range(0, stop, b):
            batch = keys[start:start + b]
            if self.world_size > 1:
                lo, hi = share_range(len(batch), self.rank, self.world_size)
                batch = batch[lo:hi] if hi > lo else [EmptyShare(batch[0])]
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class TransformDataset(Dataset):
    """`base[i] -> (x, y)`; returns `(transform(x, generator), y)` with a generator seeded by
    (seed, epoch, i). Indexed by int (epoch 0) or by the (epoch, i) keys of a keyed sampler.
    With `with_indices`, items are `(x, y, i)`: batches then carry their sample indices."""

    def __init__(self, base, transform: Callable | None, seed: int = 0, with_indices: bool = False,
                 seed_samples: bool = False):
        self.base, self.transform, self.seed, self.with_indices = base, transform, seed, with_indices
        # a user's dataset that draws from the global generators (torch.rand, numpy.random, random)
        # in __getitem__: each sample draws from generators seeded by (seed, epoch, index), so its
        # augmentation is the same on any worker, in any order, and after a resume
        self.seed_samples = seed_samples

    def __len__(self) -> int:
        return len(self.base)

    def _seeded(self, epoch: int, i: int):
        return _seeded_item(self.base, self.seed, epoch, i)

    def __getitem__(self, key):
        if isinstance(key, EmptyShare):
            return EmptyShare(self[key.key])
        epoch, i = key if isinstance(key, tuple) else (0, key)
        x, y = self._seeded(epoch, i) if self.seed_samples else self.base[i]
        if self.transform is not None:
            g = torch.Generator().manual_seed(derive_seed(self.seed, epoch, i))
            if getattr(self.transform, "pairs", False):   # a transform of inputs and targets together
                x, y = self.transform(x, y, g)
            else:
                x = self.transform(x, g)
        return (x, y, i) if self.with_indices else (x, y)


def _seeded_item(base, seed: int, epoch: int, i: int):
    """`base[i]` with torch's (CPU), numpy's and Python's global generators seeded by
    (seed, epoch, i). In the training process they are put back afterwards (the caller's
    streams go on as if nothing had drawn); in a loader worker nothing else draws from them, so
    they are only seeded. Cost matters here: it is paid per sample, in a worker that shares the
    cores with the training step. `torch.manual_seed` (about 90 us: it visits every device
    backend) and numpy's get/set_state (about 90 us) took 0.37 ms a sample, and a worker that
    busy halved a 2-core CPU's training speed on a small ResNet (0.19 against 0.10 s a step);
    seeding the CPU generator alone and skipping the put-back in workers takes about 10 us."""
    s = derive_seed(seed, epoch, i)
    if torch.utils.data.get_worker_info() is not None:
        seed_host_generators(s)
        return base[i]
    py, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        seed_host_generators(s)
        try:
            return base[i]
        finally:
            random.setstate(py)
            np.random.set_state(np_state)


def resumable_sampler(loader) -> "tuple[ResumableSampler, int] | None":
    """The ResumableSampler of a DataLoader (given as its sampler, or inside a
    ResumableBatchSampler) and the loader's batch size; None for any other loader."""
    if not isinstance(loader, DataLoader):
        return None
    if isinstance(loader.batch_sampler, ResumableBatchSampler):
        return loader.batch_sampler.sampler, loader.batch_sampler.batch_size
    if isinstance(loader.sampler, ResumableSampler) and loader.batch_size is not None:
        return loader.sampler, loader.batch_size
    return None


def carry_sample_indices(loader) -> "tuple[object, int] | None":
    """Make a hasten loader's batches carry their sample indices, `(inputs, targets, indices)`,
    for methods that keep something per sample (InfoBatch's scores, selective backprop's recorded
    losses). Returns the object that takes a `selector` for the samples of an epoch (the
    DeviceLoader itself, or make_dataloader's ResumableSampler) and the number of samples; None,
    with nothing changed, for a loader that cannot carry them."""
    if hasattr(loader, "selector") and hasattr(loader, "with_indices"):      # DeviceLoader
        loader.with_indices = True
        return loader, loader.num_samples
    found = resumable_sampler(loader)
    dataset = getattr(loader, "dataset", None)
    if found is not None and isinstance(dataset, TransformDataset):
        dataset.with_indices = True
        return found[0], len(dataset)
    return None


def keeps_state(loader) -> bool:
    """A loader that saves and restores its own position (torchdata's StatefulDataLoader, a
    streaming library's loader, a user's own with state_dict/load_state_dict), and is not one
    hasten resumes from the clock itself (its own loaders, a DataLoader over a ResumableSampler)."""
    return (callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))
            and not hasattr(loader, "iter_epoch") and resumable_sampler(loader) is None)


def data_identity(loader) -> "dict | None":
    """What the training loader's data proves itself to be, for a checkpoint to record: the
    `data_identity` (a plain dict) of the dataset under the loader and the wrappers hasten and
    torch put around one (`dataset`, `base`, `split`), e.g. a prepared source's manifest digest
    (hasten.data.streaming.StreamSplit); None when nothing under it says."""
    obj = getattr(loader, "dataset", None)
    for _ in range(8):
        if obj is None:
            return None
        found = getattr(obj, "data_identity", None)
        if isinstance(found, dict):
            return found
        obj = next((getattr(obj, a) for a in ("dataset", "base", "split") if getattr(obj, a, None) is not None), None)
    return None


def plain_state(value, depth: int = 0) -> bool:
    """Whether a loader's state is made of what a checkpoint may hold and load without running
    code: mappings, lists, numbers, strings, None and tensors."""
    if depth > 50:
        return False
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return True
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and plain_state(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(plain_state(v, depth + 1) for v in value)
    return False


def epoch_iterator(loader, seed: int, epoch: int, skip_batches: int = 0, restored: bool = False) -> Iterator:
    """Start epoch `epoch` of `loader`, `skip_batches` batches in.

    - hasten loaders implement `iter_epoch(epoch, skip_batches)` and are used directly;
    - a DataLoader over a ResumableSampler starts part-way without loading skipped data;
    - a loader that keeps its own state (`keeps_state`) and had it restored from the checkpoint
      (`restored`) continues where it stood: nothing skipped, nothing reseeded;
    - any other iterable is started with the global torch RNG seeded from (seed, epoch)
      inside `fork_rng` (so a plain RandomSampler shuffles reproducibly and the caller's RNG
      is untouched), and skipped batches are loaded and dropped.
    """
    if hasattr(loader, "iter_epoch"):
        return iter(loader.iter_epoch(epoch, skip_batches))
    if restored:
        return iter(loader)
    found = resumable_sampler(loader)
    if found is not None:
        sampler, batch = found
        sampler.set_epoch(epoch, skip_batches * batch)
        skip_batches = 0
    else:
        inner = getattr(loader, "sampler", None)
        if hasattr(inner, "set_epoch"):  # DistributedSampler
            inner.set_epoch(epoch)
        if skip_batches and not keeps_state(loader):
            warnings.warn(f"resuming {skip_batches} batches into epoch {epoch} with a {type(loader).__name__} that keeps "
                          "no state and has no resumable sampler: those batches are loaded and dropped, and the rest "
                          "of the epoch matches the uninterrupted run only if the loader's order depends on torch's "
                          "global seed alone (make_dataloader, or torchdata's StatefulDataLoader, resume exactly)")
    return _forked(loader, derive_seed(seed, epoch), skip_batches)


def _forked(loader, seed: int, skip: int) -> Iterator:
    """Create the iterator (and take the first batch, or the skipped ones) with the global RNG
    seeded for this epoch, then restore it: the epoch's order and worker seeds depend only
    on (seed, epoch), and the batches after a resume point draw from the restored RNG just
    as they did in the uninterrupted run. The rest of the epoch comes straight from the
    loader's own iterator (a C-level chain, no generator frame per batch)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        it = iter(loader)
        try:
            if skip == 0:
                first = [next(it)]
            else:
                first = []
                for _ in range(skip):
                    next(it)
        except StopIteration:
            return iter(())
    return itertools.chain(first, it)
