"""Selective backprop: back-propagate only the hardest samples of each batch (Jiang et al., 2019).

Each step first scores the whole batch with a forward pass without gradients, then runs
the normal forward and backward on the `keep` fraction with the highest loss. The scoring
pass costs about a quarter of a training step, so with keep=0.5 a step costs about 0.8 of a
full one (docs/methods/selective_backprop.md), and the gradient concentrates on the samples
the model gets most wrong. The
scoring pass runs in training mode (batch norm uses batch statistics, as the step will).

Both passes would update batch norm's running statistics, the last from the hardest samples
only, which are not the data evaluation sees. `running_stats` says which pass keeps its
update: "both" (each pass updates them, as a model left alone would), "scoring" (only the
pass over the whole batch: the training pass's update is undone) or "training".

Functional form: `select_hardest(losses, keep)` -> the indices of the top `keep` fraction
(on the device, no host synchronisation). The Algorithm wraps the step seam; `start` and
`end` (typed time) bound when it is active; `interrupt=n` makes every n-th step a full one.
`running_stats_of(model)` and `restore_running_stats(saved)` hold and put back batch norm's
running statistics (for the same choice in a loop of your own).

`average_stats=n` (0: off) makes batch norm's running statistics at the end of the run the plain
average, over its last n steps, of the statistics of the samples each step trained on (the
scoring pass's update undone in those steps; `average_running_stats`): a model trained on its
hardest samples expects their statistics, and with a high momentum the running statistics
otherwise hold the last two or three steps' (docs/methods/selective_backprop.md). It costs no
extra pass.

`score_every=n` (1: every step scores its batch) scores afresh only in every n-th epoch counted from
the first with selection; in the others each batch is ranked by the latest loss recorded for each
of its samples, from the last pass that computed it: a scoring pass, a training pass it was chosen
for, or a full step (before selection starts, or an `interrupt` step; `record_full_steps=False`
leaves those out, so only losses from selection's own passes rank). A batch that holds a sample
without one is scored afresh. Those steps skip the scoring
pass. The loader must carry sample indices (hasten's `DeviceLoader` or `make_dataloader`). Under
torch.distributed every rank records every rank's losses (one all-gather of losses and sample
indices per pass, as InfoBatch does), so each rank can rank whatever samples the next epoch deals
it, and the ranks agree on which steps score afresh (one all-reduce of a count per ranked step).

`beta` (null: the hardest `keep` fraction) draws the `keep` fraction at random instead, without
replacement, each sample weighted by its loss's percentile in the batch to the power beta
(`select_weighted`; Jiang et al.'s rule, which draws each sample on its own, with the number drawn
fixed here so a step's cost is): a softer focus on the hardest samples. beta=0 is the control: a
uniform random subset, with no scoring pass at all (does the selection earn its scoring pass?).

`score_scale` < 1 (image batches only) scores downscaled images (`resize_batch`, sides rounded
to a multiple of 4 pixels): the scoring pass then costs about score_scale^2 of a full-size
forward, and ranks the samples by their loss at that size.
"""
from __future__ import annotations

import contextlib

import torch

from ..core import Algorithm, Time
from ..data.resumable import carry_sample_indices
from ..data.batches import batch_size, check_images, forward, index_batch
from ..distributed.tensors import gather_indexed
from ..distributed.world import all_sum
from ..registry import register_algorithm
from ._bn_stats import average_running_stats, restore_running_stats, running_stats_of
from .progressive_resizing import resize_batch


def kept_count(n: int, keep: float) -> int:
    """How many of `n` samples the `keep` fraction (0 < keep <= 1) is: rounded, at least one."""
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must lie in (0, 1], got {keep}")
    return max(1, int(round(n * keep)))


def select_hardest(losses: torch.Tensor, keep: float) -> torch.Tensor:
    """The indices of the `keep` fraction (0 < keep <= 1, at least one) of samples with the largest
    `losses`."""
    return torch.topk(losses.detach().float(), kept_count(losses.shape[0], keep), sorted=False).indices


def select_weighted(losses: torch.Tensor, keep: float, beta: float,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """The indices of the `keep` fraction of samples (at least one) drawn at random without
    replacement, each with weight p^beta where p in (0, 1] is its loss's percentile in the batch
    (the hardest 1, the easiest 1/n): Jiang et al.'s selection rule with the number drawn fixed, so a
    step's cost is. beta 0 draws uniformly; the larger beta, the closer to `select_hardest`. Ties in
    loss share no rank (the order among them is torch's sort). On the device; no host synchronisation."""
    if not beta >= 0.0:
        raise ValueError(f"beta (the selection's sharpness) must be >= 0, got {beta}")
    n = losses.shape[0]
    k = kept_count(n, keep)
    ranks = losses.detach().float().argsort().argsort()          # 0: the easiest
    weights = ((ranks + 1).double() / n) ** float(beta)
    return torch.multinomial(weights, k, replacement=False, generator=generator)


RUNNING_STATS = ("both", "scoring", "training")


def per_sample_losses(model, state, batch, score_scale: float = 1.0) -> torch.Tensor:
    inputs, targets = state.batch_fn(batch)
    if score_scale != 1.0:   # score downscaled images: the pass costs about score_scale^2 of a full one
        check_images(inputs, "selective_backprop with score_scale")
        inputs = resize_batch(inputs, score_scale)
    with torch.no_grad(), state.autocast():
        outputs = forward(model, inputs)
        losses = (state.train_loss_fn or state.loss_fn)(outputs, targets)
    n = batch_size(batch)
    if losses.dim() == 0 or losses.numel() % n:
        raise ValueError("selection needs per-sample (or per-token) losses from loss_fn; got a scalar")
    return losses.view(n, -1).float().mean(1)


@register_algorithm("selective_backprop")
class SelectiveBackprop(Algorithm):
    def __init__(self, keep: float = 0.5, start: str = "0dur", end: str = "1dur", interrupt: int = 0,
                 running_stats: str = "both", score_scale: float = 1.0, average_stats: int = 0,
                 score_every: int = 1, record_full_steps: bool = True, beta: float | None = None):
        if not 0.0 < keep <= 1.0:
            raise ValueError(f"keep must lie in (0, 1], got {keep}")
        if not 0.0 < score_scale <= 1.0:
            raise ValueError(f"score_scale (the image scale of the scoring pass) must lie in (0, 1], got {score_scale}")
        self.score_scale = float(score_scale)
        if running_stats not in RUNNING_STATS:
            raise ValueError(f"running_stats must be one of {', '.join(RUNNING_STATS)} (which pass updates "
                             f"batch norm's running statistics), got {running_stats!r}")
        self.running_stats = running_stats
        if isinstance(average_stats, bool) or not isinstance(average_stats, int) or average_stats < 0:
            raise ValueError(f"average_stats (the last steps whose batch-norm statistics are averaged; 0: off) must be "
                             f"a whole number >= 0, got {average_stats!r}")
        if average_stats and running_stats == "scoring":
            raise ValueError("average_stats averages the statistics of the samples each step trained on, and "
                             "running_stats='scoring' keeps those of the whole batch: choose one")
        self.average_stats = average_stats
        if isinstance(score_every, bool) or not isinstance(score_every, int) or score_every < 1:
            raise ValueError(f"score_every (score afresh every n-th epoch; 1: every step) must be a whole number >= 1, "
                             f"got {score_every!r}")
        self.score_every = score_every
        if not isinstance(record_full_steps, bool):
            raise ValueError(f"record_full_steps (do full steps record their samples' losses for score_every?) must be "
                             f"true or false, got {record_full_steps!r}")
        self.record_full_steps = record_full_steps
        if beta is not None:
            if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta >= 0:
                raise ValueError(f"beta (null: the hardest samples; a number >= 0: drawn with weight percentile^beta) "
                                 f"must be null or >= 0, got {beta!r}")
            beta = float(beta)
            if beta == 0.0 and (score_every > 1 or score_scale < 1.0 or running_stats == "scoring"):
                raise ValueError("beta=0 draws a uniform random subset without a scoring pass, so score_every, "
                                 "score_scale and running_stats='scoring' have nothing to act on: leave them at "
                                 "their defaults")
        self.beta = beta
        self._scores = self._seen = self._first_epoch = self._state = None
        self._recording = False
        self.keep, self.start, self.end, self.interrupt = keep, Time.parse(start), Time.parse(end), int(interrupt)
        self._forced = False

    def step_paths(self, state):
        # a compiled run's warm-up: the scoring pass (no gradients, the whole batch) and the step on
        # the chosen samples are other graphs; make them before the clock, whenever the window opens
        if state.fraction_of(self.start) >= state.fraction_of(self.end):
            return []

        @contextlib.contextmanager
        def selecting():
            self._forced = True
            try:
                yield
            finally:
                self._forced = False
        return [selecting]

    def active(self, state) -> bool:
        if self._forced:
            return True
        p = state.progress
        if self.interrupt and state.timestamp.batch % self.interrupt == 0:
            return False
        return state.fraction_of(self.start) <= p < state.fraction_of(self.end)

    # ------------------------------------------------------------------ recorded losses (score_every > 1)
    def fit_start(self, state, logger):
        if self.score_every == 1:
            return
        self._state = state
        carrier = carry_sample_indices(state.train_dataloader)
        if carrier is None:
            raise ValueError("selective_backprop with score_every > 1 needs a loader that carries sample indices: "
                             "hasten.data.DeviceLoader or hasten.data.make_dataloader(...); or set score_every=1")
        n = carrier[1]
        # one spare slot at the end (index n): where the padding of the ranks' all-gather lands
        if self._scores is None or self._scores.shape[0] not in (n, n + 1):
            self._scores = torch.zeros(n + 1, device=state.device)
            self._seen = torch.zeros(n + 1, dtype=torch.bool, device=state.device)
        else:
            if self._scores.shape[0] == n:   # a checkpoint from before the spare slot
                self._scores = torch.cat([self._scores, self._scores.new_zeros(1)])
                self._seen = torch.cat([self._seen, self._seen.new_zeros(1)])
            self._scores, self._seen = self._scores.to(state.device), self._seen.to(state.device)

    def wrap_loss(self, loss_fn):
        if self.score_every == 1:
            return loss_fn

        def recording_loss(outputs, targets):
            losses = loss_fn(outputs, targets)
            if self._recording:   # a training pass (on the chosen samples, or a full step): their latest losses
                self._record(self._state.micro_batch[-1], losses)
            return losses
        return recording_loss

    def _record(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        n = indices.shape[0]
        if losses.dim() == 0 or losses.numel() % n:
            raise ValueError("score_every > 1 needs per-sample (or per-token) losses from loss_fn; got a scalar")
        with torch.no_grad():
            indices = indices.to(self._scores.device)
            values = losses.detach().view(n, -1).float().mean(1).to(self._scores.device)
            world = self._state.runtime.world
            if world.size > 1:   # every rank records every rank's samples
                share = -(-self._state.global_batch_size // world.size)   # the largest share a rank may hold
                values, indices = gather_indexed(values, indices, world.size, share, self._scores.shape[0] - 1)
            self._scores.index_copy_(0, indices, values)
            self._seen.index_fill_(0, indices, True)

    def _ranking(self, state, batch) -> torch.Tensor | None:
        """The recorded losses of the batch's samples, when this step may rank by them; else None."""
        if self.score_every == 1 or self._forced:
            return None
        epoch = state.timestamp.epoch
        if self._first_epoch is None:
            self._first_epoch = epoch
        if (epoch - self._first_epoch) % self.score_every == 0:
            return None
        indices = batch[-1].to(self._scores.device)
        unseen = float((~self._seen[indices]).sum())
        if state.runtime.world.size > 1:   # the ranks score together or not at all
            unseen = all_sum(state.device, unseen)
        return None if unseen else self._scores[indices]

    def state_dict(self) -> dict:
        if self._scores is None:
            return {}
        return {"scores": self._scores, "seen": self._seen,
                "first_epoch": -1 if self._first_epoch is None else self._first_epoch}

    def load_state_dict(self, sd: dict) -> None:
        if sd:
            self._scores, self._seen = sd["scores"].clone(), sd["seen"].clone()
            self._first_epoch = None if int(sd["first_epoch"]) < 0 else int(sd["first_epoch"])

    # ------------------------------------------------------------------ the step
    def averaging_index(self, state) -> int | None:
        """Where this step lies in the run's last `average_stats` steps (0 for the first of them),
        or None outside them; read from the run's progress, so a resumed run picks it up."""
        if not self.average_stats or self._forced:
            return None
        one = state.batch_fraction()
        if one <= 0.0:
            raise ValueError("selective_backprop: average_stats needs a run whose length in batches is known "
                             "(max_duration in batches, or in epochs of a loader with a length); set average_stats=0")
        left = round((1.0 - state.progress) / one)   # steps left, this one included
        return self.average_stats - left if 1 <= left <= self.average_stats else None

    def wrap_step(self, step):
        def selective_step(state):
            window = self.averaging_index(state)
            model = state.forward_model
            if not self.active(state):   # a full step: its losses are its samples' latest too, if they count
                self._recording = self._scores is not None and self.record_full_steps
                try:
                    if window is None:
                        return step(state)
                    before = running_stats_of(model)
                    step(state)
                    average_running_stats(before, window)
                    return
                finally:
                    self._recording = False
            batch = state.batch
            before = after_scoring = None
            if self.beta == 0.0:   # the control: a uniform random subset, no scoring pass
                losses = torch.zeros(batch_size(batch))
            else:
                losses = self._ranking(state, batch)
            if losses is None:   # score the batch
                keep_from = "training" if window is not None else self.running_stats
                before = running_stats_of(model) if keep_from == "training" else None
                losses = per_sample_losses(model, state, batch, self.score_scale)
                if before is not None:
                    restore_running_stats(before)
                after_scoring = running_stats_of(model) if keep_from == "scoring" else None
                if self._scores is not None and not self._forced:
                    self._record(batch[-1], losses)
            elif window is not None:
                before = running_stats_of(model)
            chosen = select_hardest(losses, self.keep) if self.beta is None else \
                select_weighted(losses, self.keep, self.beta)
            state.batch = index_batch(batch, chosen)
            self._recording = self._scores is not None and not self._forced
            try:
                step(state)
            finally:
                state.batch, self._recording = batch, False
            if after_scoring is not None:
                restore_running_stats(after_scoring)
            if window is not None:
                average_running_stats(before, window)
        return selective_step


__all__ = ["select_hardest", "select_weighted", "running_stats_of", "restore_running_stats", "average_running_stats",
           "SelectiveBackprop"]
