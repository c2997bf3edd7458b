"""What EMA and SWA share: an average of the weights kept beside the model, evaluated in its
place, and put in place at the end of fit only when it is the better model.

Every evaluation during training evaluates the average (the trained weights come back after
it). At the last evaluation of a run (progress 1) the trained weights are evaluated first,
seen by algorithms only (`state.evaluate`), then the average; the better of the two by the
run's quality (`state.quality`: val/loss by default, the task's metric under `hasten train`)
stays in the model, and the logged evaluation is that model's. The log says which
(`NAME/average_kept`, and both values); a warning says so when the trained weights win. A run
that ends without that evaluation (no evaluation set, or stopped early) gets the average put
in untested, and a warning saying so.

That choice is made on the evaluation data; where those are the test set, the score logged is
the better of two models on it. `final_swap="always"` keeps the average without the
comparison (and without the second evaluation); `final_swap=False` keeps the trained weights.
"""
from __future__ import annotations

import itertools
import warnings

import torch
from torch.optim.swa_utils import update_bn

from ..core import Algorithm
from ..distributed.tensors import local_tensors
from ..models import has_batch_norm


def recompute_batchnorm(state, batches: int) -> None:
    """Batch-norm statistics of the model as it is, over the first `batches` training batches of
    epoch 0 (the same batches every time), with torch's `swa_utils.update_bn`; nothing without
    batch norm or with `batches` 0 (the statistics stay as they are)."""
    if batches <= 0 or not has_batch_norm(state.model):
        return
    loader = state.train_dataloader
    it = loader.iter_epoch(0) if hasattr(loader, "iter_epoch") else iter(loader)
    inputs = [state.batch_fn(b)[0] for b in itertools.islice(it, batches)]
    update_bn(inputs, state.model, device=state.device)


def final_swap_mode(value) -> "bool | str":
    """`final_swap` as given, once checked: True, False or 'always'."""
    if value is True or value is False or value == "always":
        return value
    raise ValueError(f"final_swap must be true (keep the better of average and trained weights), false (keep "
                     f"the trained weights) or 'always' (keep the average, not compared), got {value!r}")


class WeightAverage(Algorithm):
    """Subclasses say whether an average exists (`has_average`), which tensors it covers
    (`_tensors`) and how it goes into the model (`_put_average`); this class does the rest."""

    final_swap = True    # put the average in at the end (when it is the better model)
    _backup: list | None = None
    _trained_result: dict | None = None
    _judging = _decided = False

    # ------------------------------------------------------------------ for subclasses
    def has_average(self) -> bool:
        raise NotImplementedError

    def _tensors(self, state) -> list[torch.Tensor]:
        """The model's tensors the average replaces (and the backup restores)."""
        raise NotImplementedError

    def _put_average(self, state) -> None:
        """Copy the average into the model's tensors."""
        raise NotImplementedError

    # ------------------------------------------------------------------ swapping
    @torch.no_grad()
    def _average_in(self, state) -> None:
        self._backup = [t.detach().clone() for t in local_tensors(self._tensors(state))]
        self._put_average(state)

    @torch.no_grad()
    def _trained_back(self, state) -> None:
        torch._foreach_copy_(local_tensors(self._tensors(state)), self._backup)
        self._backup = None

    # ------------------------------------------------------------------ events
    def fit_start(self, state, logger):
        self._decided = False

    def eval_start(self, state, logger):
        if self._judging or self._decided or not self.has_average():
            return
        if self.final_swap is True and state.progress >= 1.0 and state.evaluate is not None:
            self._judging = True   # the trained weights, as they are, for the comparison at EVAL_END
            try:
                self._trained_result = state.evaluate()
            finally:
                self._judging = False
        self._average_in(state)

    def eval_end(self, state, logger):
        if self._judging or self._backup is None:
            return
        trained, self._trained_result = self._trained_result, None
        if self.final_swap == "always" and state.progress >= 1.0:   # the average stays in, not compared
            self._backup, self._decided = None, True
            logger.log({f"{self.registry_name}/average_kept": 1.0})
            return
        if trained is None:   # an evaluation during training: the trained weights come back
            self._trained_back(state)
            return
        metric, direction = state.quality
        avg, own = state.eval_metrics.get(metric), trained.get(metric)
        if avg is None and own is not None:   # a host's validation logs its own names: score the average the same way
            avg = state.evaluate().get(metric)
        keep = own is None or avg is None or (avg >= own if direction == "max" else avg <= own)
        name = self.registry_name
        if keep:
            self._backup = None   # the average stays in
        else:
            self._trained_back(state)
            state.eval_metrics.update(trained)   # the logged evaluation is of the model left in place
            logger.log(trained)
            warnings.warn(f"{name}: the average evaluated worse than the trained weights ({metric} {avg:.4f} vs "
                          f"{own:.4f}); the trained weights were kept")
        logger.log({k: v for k, v in ((f"{name}/average_kept", float(keep)), (f"{name}/average_{metric}", avg),
                                      (f"{name}/trained_{metric}", own)) if v is not None})
        self._decided = True

    def fit_end(self, state, logger):
        if self.final_swap and not self._decided and self.has_average():
            with torch.no_grad():
                self._put_average(state)
            self._decided = True
            if self.final_swap == "always":
                return
            warnings.warn(f"{self.registry_name}: the run ended without a final evaluation to compare the average with "
                          "(no evaluation set, or it stopped early); the average was put in place untested "
                          "(final_swap=False keeps the trained weights)")
