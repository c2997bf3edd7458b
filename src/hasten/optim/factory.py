"""Where optimizers come from: the recipe's `optimizer` section made into torch optimizers for
a model (`build_optimizer`), and the Trainer's `optimizers=` and `schedulers=` arguments
(instances, lists or factories) made into lists once the model is ready (`build_optimizers`,
`build_schedulers`: after INIT's surgery and FSDP's sharding, so they hold the parameters as
they will train)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..errors import ConfigError
from .muon import muon_for, muon_optimizers, split_for_muon
from .param_groups import apply_lr_multipliers, param_groups
from .sgdw import SGDW, decoupled_hparams

if TYPE_CHECKING:   # annotations only: the optimizer section and the runtime are above this layer
    from ..config import OptimizerConfig
    from ..runtime import Runtime


def build_optimizer(cfg: "OptimizerConfig", model: torch.nn.Module, runtime: "Runtime", batch_size: int | None = None,
                    compiled: bool = False):
    """The recipe's optimizer(s) for `model`; Muon's Newton-Schulz precision follows the runtime's.
    `compiled` (trainer.compile_optimizer): torch.compile does not trace fused optimizers, so
    AdamW and SGD take their foreach form, which the compiled step fuses itself."""
    sgd, adam, mu = cfg.sgd, cfg.adam, cfg.muon   # the recipe's loader checked them (hasten.config)
    if compiled and cfg.fused:
        raise ConfigError("optimizer.fused=true with trainer.compile_optimizer: torch.compile does not trace fused "
                          "optimizers (their step stays torch's own kernel); drop optimizer.fused")
    fused = cfg.fused if cfg.fused is not None else runtime.device.type in ("cpu", "cuda") and not compiled
    if cfg.name == "muon" and mu.others == "adamw":
        return muon_optimizers(model, muon_lr=mu.lr, muon_momentum=mu.momentum,
                               muon_weight_decay=mu.weight_decay, adam_lr=cfg.lr, adam_betas=adam.betas,
                               adam_weight_decay=cfg.weight_decay, adjust_lr_fn=mu.adjust_lr, fused=fused,
                               ns_steps=mu.ns_steps, normalize_weights=mu.normalize,
                               ns_dtype=mu.ns_dtype, precision=runtime.precision, foreach=mu.foreach,
                               ns_coefficients=mu.ns_coefficients)
    if cfg.name == "muon":   # Muon for the hidden matrices and kernels, SGD with the group rules for the rest
        hidden, other = split_for_muon(model)
        opts = [muon_for([p for _, p in hidden], mu.lr, mu.momentum, mu.weight_decay, mu.adjust_lr, mu.ns_steps,
                         mu.normalize, ns_dtype=mu.ns_dtype, precision=runtime.precision,
                         foreach=mu.foreach, ns_coefficients=mu.ns_coefficients)] if hidden else []
        if other:
            groups = param_groups(other, cfg.weight_decay, cfg.decay_min_dim, tuple(cfg.no_decay), cfg.lr_multipliers,
                                  cfg.decay_ignores_lr_mult)
            opts.append(apply_lr_multipliers(torch.optim.SGD(groups, lr=cfg.lr, momentum=sgd.momentum,
                                                             nesterov=sgd.nesterov, fused=fused)))
        return opts
    groups = param_groups(model, cfg.weight_decay, cfg.decay_min_dim, tuple(cfg.no_decay), cfg.lr_multipliers,
                          cfg.decay_ignores_lr_mult)
    if cfg.name == "sgd":
        opt = torch.optim.SGD(groups, lr=cfg.lr, momentum=sgd.momentum, nesterov=sgd.nesterov, fused=fused)
    elif cfg.name == "sgdw":
        lr, wd = cfg.lr, cfg.weight_decay
        if sgd.per_example:
            if not batch_size:
                raise ValueError("optimizer.sgd.per_example needs the batch size (data.batch_size)")
            h = decoupled_hparams(cfg.lr, cfg.weight_decay, sgd.momentum, batch_size)
            lr, wd = h["lr"], h["weight_decay"]
            for g in groups:
                g["weight_decay"] = wd if g["weight_decay"] else 0.0
        opt = SGDW(groups, lr=lr, momentum=sgd.momentum, nesterov=sgd.nesterov)
    else:
        cls = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
        opt = cls(groups, lr=cfg.lr, betas=tuple(adam.betas), eps=adam.eps, fused=fused)
    return apply_lr_multipliers(opt)


def build_optimizers(model: torch.nn.Module, optimizers: Any) -> list:
    """The optimizers as a list: given, or built by a factory `f(model)`; default AdamW(lr=1e-3).
    Each must hold only the model's own parameters."""
    given = optimizers
    if optimizers is None:
        optimizers = torch.optim.AdamW(model.parameters(), lr=1e-3)
    elif callable(optimizers) and not isinstance(optimizers, torch.optim.Optimizer):
        optimizers = optimizers(model)
    opts = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
    for opt in opts:
        if not isinstance(getattr(opt, "param_groups", None), list):
            made = " (what the factory returned)" if callable(given) and given is not optimizers else ""
            raise TypeError(f"optimizers: {opt!r:.80} ({type(opt).__name__}){made} is not an optimizer; give a "
                            "torch.optim.Optimizer, a list of them, or a factory, e.g. "
                            "optimizers=lambda model: torch.optim.AdamW(model.parameters(), lr=1e-3)")
    owned = {id(p) for p in model.parameters()}
    for opt in opts:
        for g in opt.param_groups:
            for p in g["params"]:
                if id(p) not in owned:
                    raise ValueError(
                        "an optimizer holds a parameter that is not in the model (was the model "
                        "changed after the optimizer was built?). Pass a factory, "
                        "optimizers=lambda model: torch.optim.SGD(model.parameters(), ...), "
                        "so it is built after model surgery.")
    return opts


def build_schedulers(schedulers: Any, optimizers: list) -> list:
    """The schedulers as a list; a factory `f(optimizer)` is called with the first optimizer."""
    if schedulers is None:
        return []
    items = list(schedulers) if isinstance(schedulers, (list, tuple)) else [schedulers]
    for s in items:
        if not callable(s) and not hasattr(s, "step") and not hasattr(s, "apply"):
            raise TypeError(f"schedulers: {s!r:.60} ({type(s).__name__}) is not a schedule; give a "
                            "hasten.optim.LRSchedule, e.g. LRSchedule('cosine', warmup='0.05dur'), a torch LR "
                            "scheduler, or a factory f(optimizer) -> scheduler")
    return [s(optimizers[0]) if callable(s) and not hasattr(s, "step") and not hasattr(s, "apply") else s
            for s in items]
