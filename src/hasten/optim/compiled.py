"""Compiled optimizer steps: each optimizer's whole update as compiled kernels.

An eager optimizer step launches a few kernels per parameter (or per group of them, with
foreach kernels) and spends host time in Python between them. On a GPU whose forward and
backward already run as compiled graphs, that host time can be most of what is left: on an
H200, the CIFAR-10 speedrun's eager Muon and SGD steps took about 2 ms of host time a step
beside 6.9 ms of kernels (docs/vision.md). `torch.compile` of the step fuses the elementwise
work into a few kernels and traces the Python away.

A compiled step specialises on the numbers it reads, so a schedule that writes a new float
learning rate each step would compile a new graph each step. PyTorch's answer, followed
here: the learning rate of every parameter group becomes a 0-dimensional tensor on the
parameters' device, and the schedules write into it in place (`set_lr`), so one graph serves
the whole run. Nothing else in a group may change during the run without a recompile
(momentum, weight decay); hasten's schedules change only the learning rate. Nor may the set of
parameters that have gradients: an algorithm that stops a parameter part-way keeps its
gradient (zeroed) and puts its value back after each step (`state.optimizer_compiled` tells
it; patch whitening's bias does so).

    steps = compile_steps(optimizers)      # learning rates become tensors; one callable each
    ...
    for step in steps:
        step()

The trainer does this with `trainer.compile_optimizer: true` (or
`Trainer(compile_optimizer=True)`); the updates equal the eager ones up to the rounding of
fused arithmetic (tests/test_compiled_optimizer.py).
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch


def lr_value(group: dict) -> float:
    """A parameter group's learning rate as a number, whether it is held as a float or a tensor
    (on a GPU this waits for the device: for logging and checkpoints, not for every step)."""
    lr = group["lr"]
    return float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)


def set_lr(group: dict, value: float) -> None:
    """Set a parameter group's learning rate: in place when it is a tensor (a compiled step
    reads the same tensor, so nothing recompiles), else as a float."""
    lr = group["lr"]
    if isinstance(lr, torch.Tensor):
        lr.fill_(value)
    else:
        group["lr"] = value


def _group_device(group: dict) -> torch.device:
    for p in group["params"]:
        return p.device
    return torch.device("cpu")


def hold_lrs(optimizers, as_tensors: bool) -> None:
    """Learning rates held as 0-dim float32 tensors on each group's device (`as_tensors`), or as
    floats. A tensor already in place is kept (the compiled step's guards hold); one on another
    device (a checkpoint's, loaded to the CPU) is replaced. `initial_lr`, the schedules' base
    rate, stays a float."""
    for opt in optimizers:
        for group in opt.param_groups:
            lr = group["lr"]
            if "initial_lr" in group and isinstance(group["initial_lr"], torch.Tensor):
                group["initial_lr"] = float(group["initial_lr"].item())
            if not as_tensors:
                if isinstance(lr, torch.Tensor):
                    group["lr"] = lr_value(group)
                continue
            device = _group_device(group)
            if isinstance(lr, torch.Tensor) and lr.device == device and lr.dtype == torch.float32 and lr.dim() == 0:
                continue
            group["lr"] = torch.tensor(lr_value(group), dtype=torch.float32, device=device)


def compile_steps(optimizers, **compile_kwargs) -> list[Callable]:
    """One compiled step function per optimizer, learning rates made tensors first
    (`hold_lrs`). On a CPU, groups with a `foreach` setting take the per-tensor form (torch's
    foreach kernels take a tensor rate only where they are capturable: GPUs; on those
    torch.compile turns `capturable` on itself). A fused optimizer (AdamW(fused=True)) is not
    traced by torch.compile, so its step stays eager, with a warning; the foreach form is what
    compiles. Keyword arguments go to `torch.compile` (default: its default mode, graph breaks
    allowed: an optimizer whose step cannot be traced whole still runs). The same optimizer
    asked again gets the same function, so its compiled graphs are reused."""
    hold_lrs(optimizers, as_tensors=True)
    compile_kwargs = _step_compile_kwargs(compile_kwargs)
    steps = []
    for opt in optimizers:
        for group in opt.param_groups:
            # torch's foreach kernels take a tensor learning rate only when capturable, which a CPU
            # is not; the per-tensor form takes it, and compiled, its loop is traced and fused anyway
            if "foreach" in group and _group_device(group).type == "cpu" and not group.get("fused"):
                group["foreach"] = False
        if any(g.get("fused") for g in opt.param_groups):
            warnings.warn(f"compile_optimizer: {type(opt).__name__} is fused, and torch.compile leaves a fused "
                          "optimizer's step to its own kernel (nothing is compiled); build it with fused=False "
                          "to compile its step", stacklevel=2)
        _prime_momentum(opt)
        fn = getattr(opt, "_hasten_compiled_step", None)
        if fn is None:
            fn = torch.compile(opt.step, **compile_kwargs)
            opt._hasten_compiled_step = fn
        steps.append(fn)
    # torch.optim's steps share one wrapper function: each optimizer adds an entry to its cache
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, 2 * len(optimizers) + 8)
    return steps


def _torch_version():
    """torch's own version object (`torch.torch_version.TorchVersion`), which compares with tuples."""
    return torch.__version__


def _step_compile_kwargs(kwargs: dict) -> dict:
    """torch.compile's arguments for an optimizer step. Before torch 2.13, inductor's loop
    reordering after fusion can fail on an optimizer step's graph: on torch 2.11 with CUDA (an
    H200), the CIFAR speedrun's compiled SGD and Muon steps stopped in the scheduler with an
    AssertionError (a fused node holding a node that is not a plain kernel; torch 2.13 skips
    such nodes instead of asserting). An optimizer step is elementwise work over tensors in
    their own layouts, where reordering loops has little to find, so before 2.13 it is turned
    off for these graphs alone (`options={'loop_ordering_after_fusion': False}`), unless the
    caller gives its own options or a mode (torch.compile takes one or the other)."""
    kwargs = dict(kwargs)
    if _torch_version() < (2, 13) and "options" not in kwargs and "mode" not in kwargs:
        kwargs["options"] = {"loop_ordering_after_fusion": False}
    return kwargs


def _prime_momentum(opt) -> None:
    """SGD's momentum buffers made before the first compiled step, as zeros. torch.optim.SGD
    makes them inside its first step, so a step compiled on empty state would compile again on
    the second; with no dampening, a zero buffer gives the same first step exactly (0 * momentum
    + gradient is the gradient, which is what a fresh buffer starts from)."""
    if not isinstance(opt, torch.optim.SGD):
        return
    for group in opt.param_groups:
        if not group["momentum"] or group["dampening"]:
            continue
        for p in group["params"]:
            state = opt.state[p]
            if p.requires_grad and state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
