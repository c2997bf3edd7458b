"""DeviceLoader: a small image dataset held on the training device, batched and augmented there.

The whole dataset lives on the device as uint8 (CIFAR-10's 50,000 training images are
150 MB). Each epoch draws a permutation on the device; each batch is gathered, normalised
to the training dtype, put in channels-last if asked, and augmented as a whole batch
(random translate with reflect padding, random or alternating flip, a random brightness shift
and contrast scale per image, cutout), with no host
synchronisation and no worker processes. On a CPU it removes the DataLoader's per-sample
Python and collation; on a GPU, host-to-device copies.

Randomness comes from (seed, epoch) for the order and (seed, epoch, batch) for the
augmentation, so a run resumed mid-epoch (`iter_epoch(epoch, skip_batches)`) sees the
same batches as the uninterrupted run.

A `selector` (see InfoBatch) may restrict an epoch to a subset of the samples: an object
with `indices()` (a LongTensor of sample indices, or None for all) and `count` (its length).

Under data parallelism (`rank`, `world_size`, or `shard_for_rank`, which the Trainer calls)
every rank walks the same global batches and gathers and augments only its share of each
(`hasten.data.batches.share_range`); the random numbers are drawn for the whole global batch and
sliced, so the shares are exactly the pixels one process would train on.
"""
from __future__ import annotations

import math
from typing import Iterator, Literal

import torch

from ..seeding import derive_seed
from .batches import share_range
from . import augment as A
from .resumable import epoch_order

FlipMode = Literal["none", "random", "alternate"]
_JITTER_STREAM = 0x6A17   # the brightness and contrast draws' own stream: (seed, epoch, batch, this)


class DeviceLoader:
    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, *, mean=None, std=None,
                 device: "str | torch.device" = "cpu", dtype: torch.dtype = torch.float32,
                 channels_last: bool = False, translate: int = 0, flip: FlipMode = "none", cutout: int = 0,
                 brightness: float = 0.0, contrast: float = 0.0,
                 shuffle: bool = True, drop_last: bool = False, seed: int = 0, with_indices: bool = False,
                 layout: Literal["auto", "nhwc", "nchw"] = "auto", rank: int = 0, world_size: int = 1):
        if images.dtype != torch.uint8:
            raise TypeError(f"DeviceLoader holds images as uint8; got {images.dtype}")
        if images.dim() != 4:
            raise ValueError(f"images must be (N, H, W, C) or (N, C, H, W); got shape {tuple(images.shape)}")
        if layout == "auto":
            layout = "nhwc" if images.shape[-1] in (1, 3, 4) and images.shape[1] not in (1, 3, 4) else "nchw"
        if flip not in ("none", "random", "alternate"):
            raise ValueError(f"flip={flip!r}: use 'none', 'random' or 'alternate'")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.device = torch.device(device)
        x = images.permute(0, 3, 1, 2) if layout == "nhwc" else images
        self.images = x.to(self.device).contiguous()   # augmented in NCHW, converted per batch
        self.labels = labels.to(self.device, torch.long)
        c = self.images.shape[1]
        self.mean = torch.as_tensor(mean if mean is not None else [0.0] * c, dtype=torch.float32, device=self.device).view(1, c, 1, 1)
        self.std = torch.as_tensor(std if std is not None else [255.0] * c, dtype=torch.float32, device=self.device).view(1, c, 1, 1)
        self.batch_size, self.dtype, self.channels_last = int(batch_size), dtype, channels_last
        self.translate, self.flip, self.cutout = int(translate), flip, int(cutout)
        A.check_jitter(brightness, contrast)
        self.brightness, self.contrast = float(brightness), float(contrast)
        self.shuffle, self.drop_last, self.seed, self.with_indices = shuffle, drop_last, seed, with_indices
        self.rank, self.world_size = rank, world_size
        self.selector = None
        self._epoch = 0
        # alternating flip: one random bit per sample, fixed for the run
        g = self._generator(seed, 2**31)
        self.first_flip = torch.randint(0, 2, (len(self.labels),), device=self.device, generator=g).bool()

    # ------------------------------------------------------------------ sizes
    @property
    def num_samples(self) -> int:
        return len(self.labels)

    def _epoch_samples(self) -> int:
        return self.selector.count if self.selector is not None and self.selector.indices() is not None else self.num_samples

    def __len__(self) -> int:
        """Batches per epoch (global batches: the same count on every rank)."""
        n = self._epoch_samples()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    # ------------------------------------------------------------------ data parallelism
    def shard_for_rank(self, rank: int, world_size: int) -> None:
        """From now on yield rank `rank`'s share of every global batch."""
        self.rank, self.world_size = int(rank), int(world_size)

    def global_batch_size(self, epoch: int, index: int) -> int:
        """The size of global batch `index` of the current epoch (all ranks together)."""
        return min(self.batch_size, self._epoch_samples() - index * self.batch_size)

    # ------------------------------------------------------------------ iteration
    def _generator(self, *parts) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(derive_seed(*parts))

    def order(self, epoch: int) -> torch.Tensor:
        """The sample indices of `epoch`, in order (on the device): the same on every rank."""
        chosen = self.selector.indices() if self.selector is not None else None
        return epoch_order(self.num_samples, chosen, self.shuffle, self.seed, epoch, self.device)

    def batch(self, indices: torch.Tensor, epoch: int, batch_index: int):
        """Gather, augment and normalise the samples `indices` (the global batch `batch_index`
        of `epoch`), or this rank's share of them under data parallelism.

        Translation and flips are index gathers done on the uint8 images; brightness and
        contrast after normalisation, then cutout (zero is the mean there). Random numbers are
        drawn for the whole global batch, then this rank's share of them is used; brightness and
        contrast draw from a stream of their own, so turning them on leaves every other draw as it was.
        """
        n = len(indices)
        part = slice(*share_range(n, self.rank, self.world_size)) if self.world_size > 1 else slice(None)
        indices = indices[part]
        x = self.images[indices]
        g = self._generator(self.seed, epoch, batch_index) if (self.translate or self.flip == "random"
                                                               or self.cutout) else None
        flip = None
        if self.flip == "random":
            flip = torch.randint(0, 2, (n,), device=self.device, generator=g).bool()[part]
        elif self.flip == "alternate":
            flip = self.first_flip[indices] ^ bool(epoch % 2)
        if self.translate:
            d = torch.randint(-self.translate, self.translate + 1, (2, n), device=self.device, generator=g)[:, part]
            x = A.translate(x, d[0], d[1], self.translate, "reflect", flip=flip)
        elif flip is not None:
            x = A.flip_where(x, flip)
        x = (x.float() - self.mean) / self.std
        if self.brightness or self.contrast:
            gj = self._generator(self.seed, epoch, batch_index, _JITTER_STREAM)
            f = A.brightness_contrast_factors(n, self.brightness, self.contrast, gj, self.device)[:, part]
            x = A.brightness_contrast(x, f[0], f[1])
        x = x.to(self.dtype)
        if self.cutout:
            h, w = x.shape[-2:]
            x = A.cutout(x, self.cutout, centres=A.cutout_centres(n, h, w, g, self.device)[:, part])
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        y = self.labels[indices]
        return (x, y, indices) if self.with_indices else (x, y)

    def iter_epoch(self, epoch: int, skip_batches: int = 0) -> Iterator:
        order = self.order(epoch)
        n = len(order)
        stop = (n // self.batch_size) * self.batch_size if self.drop_last else n
        b = self.batch_size
        for k, start in enumerate(range(0, stop, b)):
            if k < skip_batches:
                continue
            yield self.batch(order[start:start + b], epoch, k)

    def __iter__(self) -> Iterator:
        epoch = self._epoch
        self._epoch += 1
        return self.iter_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)
