"""SGDW (SGD with decoupled weight decay) and hyperparameters stated per example.

`SGDW`: `p <- p * (1 - lr * weight_decay)`, then the plain SGD (momentum, Nesterov) step on
the gradient alone: the decay does not pass through the momentum buffer, so it does not
grow by 1 / (1 - momentum) and does not interact with the gradient's scale (Loshchilov and
Hutter, 2019). Built on torch.optim.SGD: the decay is one fused foreach multiply per group.

`decoupled_hparams(lr, weight_decay, momentum, batch_size)`: state the learning rate as the
step per example *after* momentum's amplification and the weight decay as the shrink per
example, and get the arguments for SGDW. Changing momentum or batch size then leaves the
per-example dynamics unchanged (to first order), so those can be tuned independently.
"""
from __future__ import annotations

import torch


class SGDW(torch.optim.SGD):
    """torch.optim.SGD with decoupled weight decay: each step multiplies the weights by (1 - lr *
    weight_decay) before the momentum update, instead of adding weight_decay * w to the gradient. A
    param group's own `weight_decay` is decoupled too."""
    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, **kwargs):
        self._default_decay = weight_decay
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=0.0,
                         nesterov=nesterov, **kwargs)

    def add_param_group(self, group):
        # a group's own weight_decay (param_groups rules) is decoupled; torch's coupled one is 0
        wd = group.pop("weight_decay", None)
        super().add_param_group(group)
        self.param_groups[-1]["decoupled_weight_decay"] = self._default_decay if wd is None else wd

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            wd = g.get("decoupled_weight_decay", 0.0)
            if wd:
                params = [p for p in g["params"] if p.grad is not None]
                if params:
                    torch._foreach_mul_(params, 1.0 - g["lr"] * wd)
        return super().step(closure)


def decoupled_hparams(lr: float, weight_decay: float, momentum: float, batch_size: int) -> dict:
    """SGDW arguments from a per-example step size `lr` (momentum's 1 / (1 - momentum) gain
    included) and a per-example shrink `weight_decay`, for a mean-reduced loss."""
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
    torch_lr = lr * batch_size * (1.0 - momentum)
    return {"lr": torch_lr, "momentum": momentum,
            "weight_decay": weight_decay * batch_size / torch_lr if torch_lr else 0.0}
