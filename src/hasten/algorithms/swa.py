"""SWA: stochastic weight averaging over the last part of training (Izmailov et al., 2018).

From `start` (a fraction of the run) the Algorithm keeps an equal-weight running average
of the weights, updated every `update_every` batches with PyTorch's own averaging function
(`torch.optim.swa_utils.get_swa_multi_avg_fn`, what `AveragedModel` uses, applied to a list of
tensors rather than a deep copy of the model, so that a sharded model (FSDP) keeps a sharded
average); at the end the average replaces the weights and batch-norm statistics are
recomputed over the training data with `swa_utils.update_bn` (capped at `bn_batches`
batches). Pair it with a high constant or cyclic learning rate over the averaging window.

Evaluations once an average exists evaluate the averaged model, as EMA's do: the average
(and its recomputed batch-norm statistics) goes in at EVAL_START and the trained weights
come back at EVAL_END. At the end of fit the average stays only if it evaluates better than
the trained weights, and the run says which (hasten.algorithms._averaging); the run's final
evaluation measures the model fit leaves behind.
"""
from __future__ import annotations


import torch
from torch.optim.swa_utils import AveragedModel, get_swa_multi_avg_fn

from ..core import as_time
from ..distributed.tensors import local_tensors, sharded_like
from ..models import has_batch_norm
from ..registry import register_algorithm
from ._averaging import WeightAverage, final_swap_mode, recompute_batchnorm

_swa_update = get_swa_multi_avg_fn()


@torch.no_grad()
def apply_swa(model: torch.nn.Module, averaged: "AveragedModel | list[torch.Tensor]", batches=(),
              device=None) -> None:
    """Copy the averaged weights (an AveragedModel, or one tensor per parameter) into `model`,
    then recompute its batch-norm statistics over `batches` (inputs) with torch's
    `swa_utils.update_bn`; the end of SWA in any loop."""
    average = list(averaged.module.parameters()) if isinstance(averaged, AveragedModel) else averaged
    torch._foreach_copy_(local_tensors(list(model.parameters())), local_tensors(average))
    if has_batch_norm(model):
        from torch.optim.swa_utils import update_bn
        update_bn(list(batches), model, device=device)


def _weights_and_buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    return [*model.parameters(), *model.buffers()]


@register_algorithm("swa")
class SWA(WeightAverage):
    def __init__(self, start: "float | str" = 0.75, update_every: int = 1, bn_batches: int = 50,
                 final_swap: "bool | str" = True):
        self.start = as_time(start, "start")
        if self.start.unit.value == "dur" and self.start.value >= 1.0:
            raise ValueError(f"start must lie before the end of the run, got {start}")
        self.update_every, self.bn_batches, self.final_swap = int(update_every), int(bn_batches), final_swap_mode(final_swap)
        self.averaged: list[torch.Tensor] | None = None   # one tensor per parameter (sharded like it)
        self.n_averaged = 0
        self._pending = None

    def _restore_pending(self, state):
        if self._pending is None:
            return
        params, sd = list(state.model.parameters()), self._pending
        if "n_averaged" in sd and "averaged" not in sd:   # hasten <= 0.1: an AveragedModel's state dict
            names = [n for n, _ in state.model.named_parameters()]
            sd = {"averaged": [sd[f"module.{n}"] for n in names], "n": int(sd["n_averaged"])}
        self.averaged = [sharded_like(a, p).clone() for a, p in zip(sd["averaged"], params)]
        self.n_averaged, self._pending = int(sd["n"]), None

    def batch_end(self, state, logger):
        self._restore_pending(state)
        if state.progress > state.fraction_of(self.start) and state.timestamp.batch % self.update_every == 0:
            params = [p.detach() for p in state.model.parameters()]
            if self.averaged is None:
                self.averaged = [p.clone() for p in params]
            else:
                _swa_update(local_tensors(self.averaged), local_tensors(params), self.n_averaged)
            self.n_averaged += 1

    def has_average(self) -> bool:
        return self.averaged is not None

    def _tensors(self, state) -> list[torch.Tensor]:
        return _weights_and_buffers(state.model)

    def _put_average(self, state) -> None:
        """The average into the model, batch-norm statistics recomputed over the first
        `bn_batches` training batches of epoch 0 (the same batches every time)."""
        apply_swa(state.model, self.averaged)
        recompute_batchnorm(state, self.bn_batches)

    def eval_start(self, state, logger):
        self._restore_pending(state)
        super().eval_start(state, logger)

    def fit_end(self, state, logger):
        self._restore_pending(state)
        super().fit_end(state, logger)

    def state_dict(self):
        return {"averaged": self.averaged, "n": self.n_averaged} if self.averaged is not None else {}

    def load_state_dict(self, sd):
        if sd:
            self._pending = sd if "n" in sd else sd["averaged"]   # the second: hasten <= 0.1's AveragedModel state


__all__ = ["apply_swa", "SWA"]
