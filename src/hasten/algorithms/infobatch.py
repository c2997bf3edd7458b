"""InfoBatch: dynamic data pruning with an unbiased rescaled loss (Qin et al., ICLR 2024).

Each sample's score is its latest training loss. Before each epoch a random fraction
`prune_ratio` of the samples scoring below the mean is left out of the epoch; the kept
below-mean samples get their loss scaled by 1 / (1 - prune_ratio), so the expected
gradient equals the full-data one. From `delta` of the run on (default 0.875) every epoch
uses all samples again, unweighted.

Three ways to use it:
- functional: `infobatch_plan(scores, seen, prune_ratio, generator)` -> (kept, weights);
- in a plain loop, `InfoBatchPruner` (three lines; see its docstring);
- in the Trainer, the `InfoBatch` Algorithm, with a `DeviceLoader` or `make_dataloader` loader.

Unlike the reference code: scores and weights stay on the training device and are updated
with index operations (no host synchronisation per step; one per epoch, to learn the
epoch's length); no PyTorch class is patched; no global random state is used or changed
(the plan comes from a generator seeded by (seed, epoch)); nothing is pruned before every
sample has a score; epochs may change length (hasten schedules follow the progress of the
run, so they still end where they should). Under torch.distributed every rank records
every rank's losses (one all-gather of the step's losses and sample indices per micro-batch,
no host synchronisation), so all ranks hold the same scores at every step, draw the same plan
and save the same state: a data-parallel run prunes exactly the samples one process would.
"""
from __future__ import annotations

import math

import torch
from torch.utils.data import Sampler

from ..core import Algorithm, as_time
from ..data.resumable import carry_sample_indices, epoch_order
from ..distributed.tensors import gather_indexed
from ..registry import register_algorithm
from ..seeding import derive_seed


@torch.no_grad()
def infobatch_plan(scores: torch.Tensor, seen: torch.Tensor, prune_ratio: float,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples to keep this epoch (sorted indices) and every sample's loss weight.

    Among samples with a score (`seen`), those below the mean score are "well learned";
    each is dropped with probability `prune_ratio`; the kept well-learned ones are weighted
    1 / (1 - prune_ratio), all others 1.
    """
    if not 0.0 <= prune_ratio < 1.0:
        raise ValueError(f"prune_ratio must lie in [0, 1), got {prune_ratio}")
    n_seen = seen.sum().clamp_min(1)
    mean = torch.where(seen, scores, 0).sum() / n_seen
    well = seen & (scores < mean)
    u = torch.rand(scores.shape, device=scores.device, generator=generator)
    drop = well & (u < prune_ratio)
    kept = (~drop).nonzero().squeeze(1)
    weights = torch.where(well & ~drop, 1.0 / (1.0 - prune_ratio), 1.0).to(torch.float32)
    return kept, weights


class InfoBatchPruner:
    """InfoBatch state: scores, the current epoch's plan, and counts.

    In a plain loop (per-sample losses, any DataLoader that takes a sampler):

        pruner = InfoBatchPruner(len(train_set), num_epochs=epochs)
        loader = DataLoader(train_set, batch_size=256, sampler=pruner.sampler)
        ...     loss = pruner.loss(F.cross_entropy(model(x), y, reduction="none"))

    `loss` matches losses to samples by the order the sampler produced (pass `indices=` when
    the batches carry their sample indices). It records the scores and returns the weighted
    mean. Epoch lengths change, so step-counting LR schedulers should be given the total
    from `pruner.expected_steps` or, better, follow progress through epochs.
    """

    def __init__(self, num_samples: int, prune_ratio: float = 0.5, delta: float = 0.875,
                 num_epochs: int | None = None, seed: int = 0, device: "str | torch.device | None" = None,
                 shuffle: bool = True, rank: int | None = None, world_size: int | None = None):
        if not 0.0 <= prune_ratio < 1.0:
            raise ValueError(f"prune_ratio must lie in [0, 1), got {prune_ratio}")
        if not 0.0 <= delta <= 1.0:
            raise ValueError(f"delta must lie in [0, 1], got {delta}")
        self.num_samples, self.prune_ratio, self.delta = int(num_samples), prune_ratio, delta
        self.num_epochs, self.seed, self.shuffle = num_epochs, seed, shuffle
        dist = torch.distributed
        ready = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if ready else 0)
        self.world_size = world_size if world_size is not None else (dist.get_world_size() if ready else 1)
        self.device = torch.device(device) if device is not None else None
        # scores and seen have one spare slot at the end: padding of the ranks' all-gather lands there
        self.scores = self.seen = None
        self.kept: torch.Tensor | None = None          # None: the whole dataset this epoch
        self.weights: torch.Tensor | None = None
        self.count = self.num_samples
        self.epoch = -1
        self.passes = 0          # sample passes planned so far
        self.full_passes = 0     # what they would have been without pruning
        self._order = None       # plain-loop use: this epoch's sample order, to match losses
        self._cursor = 0
        if self.device is not None:
            self._allocate(self.device)

    # ------------------------------------------------------------------ storage
    def _allocate(self, device) -> None:
        self.device = torch.device(device)
        self.scores = torch.zeros(self.num_samples + 1, device=self.device)
        self.seen = torch.zeros(self.num_samples + 1, dtype=torch.bool, device=self.device)

    def indices(self) -> torch.Tensor | None:
        """The selector protocol of hasten's loaders: this epoch's samples, or None for all."""
        return self.kept

    # ------------------------------------------------------------------ epochs
    def pruning_at(self, epoch: int, progress: float | None = None) -> bool:
        if progress is None:
            progress = epoch / self.num_epochs if self.num_epochs else 0.0
        return self.prune_ratio > 0 and progress < self.delta and self.scores is not None

    def start_epoch(self, epoch: int, progress: float | None = None) -> dict:
        """Plan `epoch`: which samples it trains on and with what weights. Returns its counts."""
        self.epoch = int(epoch)
        if self.pruning_at(epoch, progress):
            g = torch.Generator(device=self.device).manual_seed(derive_seed(self.seed, epoch, 7))
            n = self.num_samples
            self.kept, self.weights = infobatch_plan(self.scores[:n], self.seen[:n], self.prune_ratio, g)
            self.count = len(self.kept)     # the one host synchronisation of the epoch
        else:
            self.kept, self.weights, self.count = None, None, self.num_samples
        self.passes += self.count
        self.full_passes += self.num_samples
        self._order, self._cursor = None, 0
        return self.stats()

    def stats(self) -> dict:
        return {"infobatch/kept": self.count, "infobatch/pruned": self.num_samples - self.count,
                "infobatch/saved_fraction": 1.0 - self.passes / self.full_passes if self.full_passes else 0.0}

    # ------------------------------------------------------------------ losses
    def update(self, losses: torch.Tensor, indices: torch.Tensor, pad_to: int | None = None) -> torch.Tensor:
        """Record per-sample `losses` of the samples `indices` as their scores and return the
        losses times their weights (unreduced). Under torch.distributed every rank records the
        losses of all ranks: `pad_to` is the largest number of samples a rank may hold in this
        call, the same on every rank (default: this rank's count, for equal shares)."""
        if losses.dim() != 1 or losses.shape[0] != indices.shape[0]:
            raise ValueError(f"InfoBatch needs one loss per sample: got losses of shape {tuple(losses.shape)} "
                             f"for {indices.shape[0]} samples (use a per-sample loss, reduction='none')")
        if self.scores is None:
            self._allocate(losses.device)
        indices = indices.to(self.device)
        with torch.no_grad():
            values, where = losses.detach().float(), indices
            if self.world_size > 1:
                values, where = gather_indexed(values, indices, self.world_size,
                                                   values.shape[0] if pad_to is None else int(pad_to), self.num_samples)
            self.scores.index_copy_(0, where, values)
            self.seen.index_fill_(0, where, True)
        if self.weights is None:
            return losses
        return losses * self.weights.index_select(0, indices).to(losses.dtype)

    def loss(self, losses: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        """Plain-loop form: update the scores and return the rescaled mean loss."""
        if indices is None:
            if self._order is None:
                raise RuntimeError("InfoBatchPruner.loss without indices= needs the DataLoader to use pruner.sampler")
            n = losses.shape[0]
            indices = self._order[self._cursor:self._cursor + n].to(losses.device, non_blocking=True)
            self._cursor += n
        return self.update(losses, indices).mean()

    # ------------------------------------------------------------------ plain-loop sampler
    def epoch_order(self, epoch: int) -> torch.Tensor:
        """This rank's samples of the planned epoch in training order (on the scores' device)."""
        return epoch_order(self.num_samples, self.kept, self.shuffle, self.seed, epoch,
                           self.device or torch.device("cpu"), self.rank, self.world_size)

    @property
    def sampler(self) -> "Sampler":
        return _PrunedSampler(self)

    def expected_steps(self, batch_size: int, num_epochs: int | None = None) -> int:
        """An upper bound on optimizer steps for a run (every epoch at full length); the
        real count is lower, known epoch by epoch from `count`."""
        e = num_epochs or self.num_epochs
        if not e:
            raise ValueError("give num_epochs")
        return e * math.ceil(self.num_samples / self.world_size / batch_size)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        n = self.num_samples
        return {"scores": None if self.scores is None else self.scores[:n], "kept": self.kept,
                "seen": None if self.seen is None else self.seen[:n], "weights": self.weights,
                "count": self.count, "epoch": self.epoch, "passes": self.passes, "full_passes": self.full_passes}

    def load_state_dict(self, sd: dict) -> None:
        for k in ("scores", "seen", "kept", "weights"):
            v = sd.get(k)
            if v is not None and self.device is not None:
                v = v.to(self.device)
            if v is not None and k in ("scores", "seen"):   # the spare slot for padding
                v = torch.cat([v, v.new_zeros(1)])
            setattr(self, k, v)
        if self.scores is not None and self.device is None:
            self.device = self.scores.device
        self.count, self.epoch = int(sd["count"]), int(sd["epoch"])
        self.passes, self.full_passes = int(sd["passes"]), int(sd["full_passes"])


class _PrunedSampler(Sampler):
    def __init__(self, pruner: InfoBatchPruner):
        self.pruner = pruner
        self._next_epoch = 0

    def __iter__(self):
        p = self.pruner
        epoch = self._next_epoch
        self._next_epoch += 1
        p.start_epoch(epoch)
        p._order = p.epoch_order(epoch)
        return iter(p._order.tolist())

    def __len__(self) -> int:
        p = self.pruner
        return p.count // p.world_size if p.world_size > 1 else p.count

    def set_epoch(self, epoch: int) -> None:
        self._next_epoch = int(epoch)


@register_algorithm("infobatch")
class InfoBatch(Algorithm):
    """The Trainer form. Logs per epoch: infobatch/kept, infobatch/pruned, infobatch/saved_fraction."""

    def __init__(self, prune_ratio: float = 0.5, delta: "float | str" = 0.875):
        if not 0.0 <= prune_ratio < 1.0:
            raise ValueError(f"prune_ratio must lie in [0, 1), got {prune_ratio}")
        self.prune_ratio, self.delta = prune_ratio, as_time(delta, "delta")
        self.pruner: InfoBatchPruner | None = None
        self._pending: dict | None = None

    def fit_start(self, state, logger):
        carrier = carry_sample_indices(state.train_dataloader)   # batches carry their sample indices
        if carrier is None:
            raise TypeError("InfoBatch in the Trainer needs a loader it can steer: hasten.data.DeviceLoader or "
                            "hasten.data.make_dataloader(...); in a plain loop use InfoBatchPruner.sampler")
        steered, num_samples = carrier
        world = state.runtime.world
        if self.pruner is None:
            self.pruner = InfoBatchPruner(num_samples, self.prune_ratio, state.fraction_of(self.delta),
                                          seed=state.seed, device=state.device, rank=world.rank,
                                          world_size=world.size)
        if self._pending is not None:
            self.pruner.load_state_dict(self._pending)
            self._pending = None
        steered.selector = self.pruner   # the loader trains on the pruner's plan

    def epoch_start(self, state, logger):
        logger.log(self.pruner.start_epoch(state.timestamp.epoch, state.progress))

    def after_loss(self, state, logger):
        batch = state.micro_batch
        if not (isinstance(batch, (tuple, list)) and len(batch) >= 3):
            raise ValueError("InfoBatch needs batches (inputs, targets, sample_indices); its loader was "
                             "changed after fit started?")
        world = state.runtime.world   # under data parallelism: the largest share any rank may hold
        pad = -(-state.global_batch_size // world.size) if world.size > 1 else None
        state.loss = self.pruner.update(state.loss, batch[-1], pad_to=pad)

    def state_dict(self) -> dict:
        return self.pruner.state_dict() if self.pruner is not None else {}

    def load_state_dict(self, sd: dict) -> None:
        if sd:
            if self.pruner is not None:
                self.pruner.load_state_dict(sd)
            else:
                self._pending = sd


__all__ = ["infobatch_plan", "InfoBatchPruner", "InfoBatch"]
