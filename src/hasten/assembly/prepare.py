"""Preparing a model to train, in the one order that works at every parallelism:

1. the model goes to the run's device;
2. INIT: algorithms change the model (surgery), callbacks observe;
3. algorithms that cannot run data-parallel are refused, with their reasons;
4. FSDP: the model is sharded (its parameters become DTensors);
5. the optimizers and schedulers are built (from factories: they hold the parameters as they
   will train), and fp16-mixed gets its gradient scaler;
6. DDP: the model is wrapped (after the optimizers: DDP keeps the parameters), with
   SyncBatchNorm first when asked;
7. torch.compile, when asked.

`prepare` returns what the loop calls: the training forward, the evaluation forward, and the
switch that reduces gradients across ranks on the last micro-batch only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from ..core.algorithm import parallel_refusal_message
from ..core.event import Event
from ..distributed.fsdp import FSDPOptions, checkpoint_blocks, shard_model
from ..optim.factory import build_optimizers, build_schedulers
from .options import ParallelOptions


@dataclass
class Prepared:
    """The model as the loop calls it."""
    forward_model: Any                          # the training forward: the model, DDP-wrapped, compiled or not
    eval_model: Any                             # evaluation: DDP's inner module (no collectives), else the above
    grad_sync: Callable[[bool], None] | None    # data parallel: reduce gradients on this micro-batch or not


def prepare(state, engine, parallel: ParallelOptions, optimizers: Any = None, schedulers: Any = None,
            compile: "bool | dict" = False, activation_checkpointing: bool = False) -> Prepared:
    """Steps 1-7 of the module docstring on `state` (its model, optimizers, schedulers and scaler
    are set); `engine` fires INIT."""
    runtime = state.runtime
    world, device = runtime.world, runtime.device
    if parallel.fsdp != FSDPOptions() and not world.sharded:
        raise ValueError("fsdp options were given but the run is not sharded: set parallelism=fsdp "
                         "(trainer.parallelism=fsdp) or leave the fsdp options out")
    if parallel.sync_batchnorm and world.sharded:
        raise ValueError("sync_batchnorm is for parallelism=ddp; under fsdp each rank normalises its own "
                         "share (ghost batch norm of the per-rank batch)")
    state.model = state.model.to(device)
    engine.run(Event.INIT)
    if world.data_parallel:
        refused = parallel_refusal_message(state.algorithms, world.parallelism)
        if refused:
            raise ValueError(refused)
    fsdp_options = parallel.fsdp
    if activation_checkpointing:
        checkpoint_blocks(state.model, fsdp_options.blocks)
    if world.sharded:
        shard_model(state.model, device, world.size, runtime.precision, fsdp_options)
    state.optimizers = build_optimizers(state.model, optimizers)
    state.schedulers = build_schedulers(schedulers, state.optimizers)
    if runtime.precision == "fp16-mixed":
        state.scaler = torch.amp.GradScaler(device.type)
    model = state.model
    ddp, grad_sync = None, (model.set_requires_gradient_sync if world.sharded else None)
    if world.parallelism == "ddp":
        if parallel.sync_batchnorm:
            if device.type != "cuda":
                raise ValueError("sync_batchnorm needs CUDA (torch's SyncBatchNorm refuses CPU tensors); on the "
                                 "CPU each rank normalises its own share, which is ghost batch norm of the "
                                 "per-rank batch: leave sync_batchnorm off")
            model = state.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)   # same parameters
        from torch.nn.parallel import DistributedDataParallel
        options = {k: v for a in state.algorithms for k, v in a.ddp_options().items()}
        ids = [device.index] if device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids, **options)
        grad_sync = lambda sync: setattr(ddp, "require_backward_grad_sync", sync)   # noqa: E731  what no_sync() sets
    forward_model = (ddp or model) if not compile else torch.compile(ddp or model, **_compile_options(compile))
    state.forward_model = forward_model
    # DDP: evaluate the module inside (no collectives in evaluation); FSDP: the sharded model
    # itself (its forward gathers parameters: every rank runs every evaluation batch)
    eval_model = model if ddp is not None else forward_model
    if captures_cuda_graphs(compile, device) and eval_model is forward_model:
        eval_model = CloneOutputs(eval_model)
    return Prepared(forward_model=forward_model, eval_model=eval_model, grad_sync=grad_sync)


CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")   # torch.compile modes that capture CUDA graphs


def captures_cuda_graphs(compile, device: torch.device) -> bool:
    """Whether `compile` (the Trainer's setting) replays CUDA graphs on `device`."""
    return device.type == "cuda" and isinstance(compile, dict) and compile.get("mode") in CUDA_GRAPH_MODES


class CloneOutputs(torch.nn.Module):
    """The evaluation forward of a model compiled with CUDA graphs, its outputs copied out of the
    graphs' memory. In inference every call of a compiled function starts a new graph
    iteration, which may overwrite the last call's outputs; an evaluation that combines several
    forwards of one batch (test-time augmentation's views) would read overwritten logits (torch
    raises an error when it does). The copy costs one small kernel a forward."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return pytree.tree_map_only(torch.Tensor, torch.clone, self.inner(*args, **kwargs))


def _compile_options(compile) -> dict:
    """torch.compile's options: static shapes unless the user asks otherwise (a graph per shape,
    each compiled in the warm-up of a compiled run: dynamic-shape graphs of convolutions have
    baked one shape's strides into their backward and failed at the next size)."""
    return {"dynamic": False, **(compile if isinstance(compile, dict) else {})}
