"""hasten's methods inside Lightning: `HastenCallback(algorithms=[...])`.

    pip install 'hasten[lightning]'
    import lightning as L
    from hasten.algorithms import EMA, LabelSmoothing, ProgressiveResizing, ChannelsLast
    from hasten.integrations.lightning import HastenCallback

    trainer = L.Trainer(max_epochs=10, callbacks=[HastenCallback([ChannelsLast(), EMA(half_life="0.1dur")])])
    trainer.fit(module, train_loader, val_loader)

Where each method acts in Lightning's loop (hasten.integrations.host has the full list):
- model surgery (channels-last, BlurPool, activation swap, ghost batch norm, stochastic depth,
  frozen batch-norm scale, Dirac init, pool reordering, gradual pruning's masks) in `setup`,
  before Lightning calls `configure_optimizers`, so the optimizers see the changed model;
- methods that change the batch (progressive resizing, MixUp, CutMix, CutOut, batch-size and
  sequence-length warm-ups) in `on_train_batch_start`, in place: the batch must be a list or
  a dict (what the default collate gives for datasets of pairs and dicts), not a tuple;
- clipping before each optimizer step; EMA, SWA, Lookahead, layer freezing and gradual
  pruning after it; EMA and SWA evaluate their average in `on_validation_*`; at the last
  validation the average and the trained weights are both scored by the module's `loss_fn` on
  the host's validation data, and the better stays (without a `loss_fn`, the average is put in
  place untested, and a warning says so);
- methods that act through the loss (label smoothing, MixUp and CutMix's mixed targets) need
  the one documented line in the LightningModule: a `loss_fn` attribute (e.g.
  `self.loss_fn = F.cross_entropy` in `__init__`) used for the training loss
  (`loss = self.loss_fn(logits, y)`); the callback puts hasten's training loss there while
  training and the plain one back for validation. Without `loss_fn` they are refused.

Refused at `setup`, with the reason (hasten.integrations.host.refusal): SAM, selective
backprop and proxy selection (they run their own forward and backward passes), InfoBatch,
TTA, patch whitening and chunked cross-entropy.
"""
from __future__ import annotations

from typing import Sequence

import torch

try:
    import lightning.pytorch as pl
except ImportError as e:   # pragma: no cover - depends on the environment
    raise ImportError("hasten.integrations.lightning needs Lightning: pip install 'hasten[lightning]'") from e

from ..core import Algorithm
from ..loss import default_loss
from .host import HostLoop, mean_over_targets

HOST = "Lightning"

_PRECISIONS = {"bf16-mixed": "bf16-mixed", "16-mixed": "fp16-mixed"}


class _SeamLoss:
    """The module's `loss_fn` while a HastenCallback runs: hasten's training loss (reduced as
    hasten reduces it) while the module trains, the module's own loss otherwise."""

    def __init__(self, base, train, module):
        self.base, self.train, self.module = base, train, module

    def __call__(self, outputs, targets, *args, **kwargs):
        if self.module.training:
            return mean_over_targets(self.train(outputs, targets), targets)
        return self.base(outputs, targets, *args, **kwargs)


class HastenCallback(pl.Callback):
    """Runs hasten Algorithms in a `lightning.Trainer` (see the module doc for where each acts).
    `seed` feeds the methods' own random draws (MixUp's mixing, CutOut's squares).
    `host_allocator="auto"` tunes glibc malloc at `setup` when training on a CPU, as `hasten
    train` does (process-wide, so off unless asked; hasten.allocator says what it sets)."""

    def __init__(self, algorithms: Sequence[Algorithm] = (), seed: int = 0, host_allocator: str = "default"):
        self.host = HostLoop(algorithms, HOST, seed=seed, host_allocator=host_allocator)   # refuses what cannot run here, now
        self._base_loss = None
        self._last_step = 0
        self._stepped_batch = None

    # ------------------------------------------------------------------ set-up
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or self.host.state is not None:
            return
        loss_algos = [a for a in self.host.algorithms if type(a).wrap_loss is not Algorithm.wrap_loss]
        if loss_algos and not callable(getattr(pl_module, "loss_fn", None)):
            names = ", ".join(getattr(a, "registry_name", a.name) for a in loss_algos)
            raise ValueError(f"{names} act(s) through the loss: give {type(pl_module).__name__} a `loss_fn` attribute "
                             "(e.g. self.loss_fn = torch.nn.functional.cross_entropy) and compute the training loss "
                             "with self.loss_fn(logits, y) (docs/integrations.md)")
        precision = _PRECISIONS.get(str(trainer.precision), "fp32")
        self.host.setup(pl_module, device=trainer.strategy.root_device, precision=precision)

    def on_fit_start(self, trainer, pl_module) -> None:
        total = trainer.estimated_stepping_batches
        per_epoch = (total // trainer.max_epochs) if trainer.max_epochs and trainer.max_epochs > 0 else None
        self.host.fit_start(total, per_epoch or None, list(trainer.optimizers))
        if callable(getattr(pl_module, "loss_fn", None)):
            self._base_loss = pl_module.loss_fn
            base = self._base_loss if self._base_loss is not None else default_loss
            train = self.host.training_loss(base)
            if train is not base:
                pl_module.loss_fn = _SeamLoss(base, train, pl_module)
        self._last_step = trainer.global_step
        if self._base_loss is not None:
            # EMA and SWA compare their average with the trained weights at the last validation:
            # both on the host's validation data, by the module's own loss (hasten.algorithms._averaging)
            self.host.state.evaluate = lambda: self._validation_loss(trainer, pl_module)

    def _validation_loss(self, trainer, pl_module) -> dict:
        """{"val/loss": the module's loss over the host's validation data} for the weights in place
        now; {} when the host has no validation data (Lightning loads it when it first validates)."""
        loaders = trainer.val_dataloaders
        if not loaders:
            return {}
        loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
        was_training, total, count = pl_module.training, 0.0, 0
        pl_module.eval()
        try:
            with torch.no_grad():
                for loader in loaders:
                    for batch in loader:
                        x, y = batch[0].to(pl_module.device), batch[1].to(pl_module.device)
                        loss = self._base_loss(pl_module(x), y)
                        total += float(loss) * len(y)
                        count += len(y)
        finally:
            pl_module.train(was_training)
        return {"val/loss": total / count} if count else {}

    # ------------------------------------------------------------------ training
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.host.epoch_start()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        new = self.host.batch(batch)
        if new is batch:
            return
        if isinstance(batch, list):
            batch[:] = list(new)
        elif isinstance(batch, dict) and isinstance(new, dict):
            batch.clear()
            batch.update(new)
        else:
            raise TypeError(f"{HOST}: a hasten method changed the batch, and this batch is a {type(batch).__name__}, "
                            "which cannot be changed in place: have the DataLoader return lists or dicts (the default "
                            "collate does for datasets of pairs)")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if optimizer is trainer.optimizers[0]:   # once per step, however many optimizers
            self.host.before_optim_step()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step == self._last_step:   # accumulating: no optimizer step yet
            return
        self._last_step = trainer.global_step
        x = batch[0] if isinstance(batch, (list, tuple)) else None
        self.host.after_step(samples=len(x) if x is not None and hasattr(x, "__len__") else None)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.host.epoch_end()

    # ------------------------------------------------------------------ evaluation and the end
    def on_validation_start(self, trainer, pl_module) -> None:
        if self.host.state is not None and not trainer.sanity_checking:
            self.host.eval_start()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.host.state is not None and not trainer.sanity_checking:
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
            self.host.eval_end(metrics)

    def on_fit_end(self, trainer, pl_module) -> None:
        self.host.fit_end()
        if isinstance(getattr(pl_module, "loss_fn", None), _SeamLoss):
            pl_module.loss_fn = self._base_loss

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return self.host.state_dict() if self.host.state is not None else {}

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict and self.host.state is not None:
            self.host.load_state_dict(state_dict)


__all__ = ["HastenCallback"]
