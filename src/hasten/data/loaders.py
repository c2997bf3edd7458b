"""DataLoader defaults that follow good practice.

Workers: one fewer than the CPU cores (at most 8), persistent between epochs; pinned
memory when training on CUDA; workers that leave Ctrl-C to the training process; a per-epoch order from (seed, epoch) and per-sample
augmentation from (seed, epoch, index), so results do not depend on the worker count and
resume exactly.
"""
from __future__ import annotations

import os
import signal

import torch
from torch.utils.data import DataLoader, Dataset

from .resumable import ResumableBatchSampler, ResumableSampler, TransformDataset, collate_shares


def default_workers() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(8, cores - 1))


def make_dataloader(dataset: Dataset, batch_size: int, shuffle: bool = True, seed: int = 0,
                    transform=None, num_workers: int | None = None, drop_last: bool = False,
                    device: "str | torch.device | None" = None, prefetch_factor: int | None = None,
                    blocks: "list[int] | None" = None, seed_samples: bool = False) -> DataLoader:
    """A DataLoader over `dataset` with a resumable order and seeded per-sample transforms.
    `batch_size` is the global batch: under data parallelism the Trainer makes each rank's
    workers load only that rank's share of every batch. `blocks`: the sizes of the shards the
    samples lie in, in order (a streamed source): the order is then shard-local. `seed_samples`:
    a user's dataset drawing from the global generators in __getitem__ gets them seeded per
    sample from (seed, epoch, index) (TransformDataset), so its augmentation resumes exactly."""
    ds = TransformDataset(dataset, transform, seed=seed, seed_samples=seed_samples)
    workers = default_workers() if num_workers is None else num_workers
    pin = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    kwargs = {}
    if workers > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=prefetch_factor or 4)
    if workers > 0:
        kwargs["worker_init_fn"] = ignore_ctrl_c
    batches = ResumableBatchSampler(ResumableSampler(len(ds), shuffle, seed, keyed=True, blocks=blocks), batch_size,
                                    drop_last)
    return DataLoader(ds, batch_sampler=batches, num_workers=workers, pin_memory=pin, collate_fn=collate_shares,
                      generator=torch.Generator().manual_seed(seed), **kwargs)


def ignore_ctrl_c(worker_id: int) -> None:
    """Loader workers ignore the terminal's Ctrl-C: the training process decides (it saves a
    checkpoint after the current step) and shuts its workers down itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class TensorPairs(Dataset):
    """(x[i], y[i]) over two tensors: the base of in-memory datasets."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} items but y has {len(y)}")
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]
