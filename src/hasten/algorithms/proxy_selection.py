"""Proxy selection: a small network picks the samples the main network trains on.

Each step the proxy (for example a narrow copy of the main architecture) runs forward and
backward on the whole batch and takes its own optimizer step (SGD with Nesterov momentum);
its per-sample losses pick the `keep` fraction of the batch with the highest loss, and only
those go through the main network's forward and backward. It pays when the proxy's full
step costs much less than the main network's saved share of the batch.

Functional form: `proxy_select(proxy, proxy_optimizer, inputs, targets, loss_fn, keep)`
trains the proxy one step and returns the selected indices. The proxy is given as a model
object or as a `{name: ..., **kwargs}` of hasten's model registry (`hasten.models.MODELS`).
"""
from __future__ import annotations

import copy

import torch

from ..core import Algorithm, Time
from ..data.batches import batch_size, index_batch
from ..models import build_model
from ..registry import register_algorithm
from .selective_backprop import select_hardest


def proxy_select(proxy, optimizer, inputs, targets, loss_fn, keep: float, autocast=None) -> torch.Tensor:
    """One step of proxy selection: compute `proxy`'s per-sample losses on the batch (under `autocast`
    if given), train the proxy one step with `optimizer` on their mean, and return the indices of
    the `keep` fraction with the highest losses (select_hardest) for the main model to train on."""
    ctx = autocast() if autocast is not None else torch.autocast("cpu", enabled=False)
    with ctx:
        losses = loss_fn(proxy(inputs), targets)
    n = targets.shape[0]
    losses = losses.view(n, -1).float().mean(1)
    losses.mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return select_hardest(losses, keep)


@register_algorithm("proxy_selection")
class ProxySelection(Algorithm):
    def __init__(self, proxy: "dict | torch.nn.Module", keep: float = 0.5, lr: float = 0.05, momentum: float = 0.9,
                 weight_decay: float = 5e-4, start: str = "0dur", end: str = "1dur"):
        if not 0.0 < keep <= 1.0:
            raise ValueError(f"keep must lie in (0, 1], got {keep}")
        self.spec, self.keep, self.lr, self.momentum, self.weight_decay = proxy, keep, lr, momentum, weight_decay
        self.start, self.end = Time.parse(start), Time.parse(end)
        self.proxy = self.optimizer = None
        self._pending = None

    def _build(self, state):
        if isinstance(self.spec, torch.nn.Module):
            proxy = self.spec
        else:
            spec = dict(self.spec)
            proxy = build_model(spec.pop("name", None), **spec)
        proxy = proxy.to(state.device)
        if any(p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
               for p in state.model.parameters()):
            proxy = proxy.to(memory_format=torch.channels_last)
        self.proxy = proxy.train()
        self.optimizer = torch.optim.SGD(proxy.parameters(), lr=self.lr, momentum=self.momentum, nesterov=True,
                                         weight_decay=self.weight_decay)
        if self._pending is not None:
            self.proxy.load_state_dict(self._pending["proxy"])
            self.optimizer.load_state_dict(self._pending["optimizer"])
            self._pending = None

    def fit_start(self, state, logger):
        if self.proxy is None:
            self._build(state)

    def wrap_step(self, step):
        def proxy_step(state):
            p = state.progress
            if not (state.fraction_of(self.start) <= p < state.fraction_of(self.end)):
                return step(state)
            batch = state.batch
            inputs, targets = state.batch_fn(batch)
            if batch_size(batch) != targets.shape[0]:
                raise ValueError("proxy selection needs one target per sample")
            idx = proxy_select(self.proxy, self.optimizer, inputs, targets, state.train_loss_fn or state.loss_fn,
                                self.keep, state.autocast)
            state.batch = index_batch(batch, idx)
            try:
                step(state)
            finally:
                state.batch = batch
        return proxy_step

    def state_dict(self) -> dict:
        if self.proxy is None:
            return {}
        return {"proxy": self.proxy.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        if not sd:
            return
        if self.proxy is None:
            self._pending = copy.deepcopy(sd)
        else:
            self.proxy.load_state_dict(sd["proxy"])
            self.optimizer.load_state_dict(sd["optimizer"])


__all__ = ["proxy_select", "ProxySelection"]
