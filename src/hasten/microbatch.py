"""Micro-batching: the global batch fixed, computed in micro-batches of a given size, or of the
largest size that fits in memory (`microbatch="auto"`).

A step of batch B in micro-batches of m is ceil(B / m) forward and backward passes whose
gradients add up to the whole batch's (the Trainer's loss reduction makes that exact:
hasten.trainer.Trainer.reduce_loss), so `microbatch` changes memory, never the mathematics.

`auto` starts with the whole batch. When a step runs out of memory, hasten clears the step
(gradients, the micro-batch losses it logged, the model's buffers such as batch-norm
statistics, and the random-number state, all as they were before the step), halves the
micro-batch and computes the same step again: the run equals one that used the final size
from its first step. The size is logged (`trainer/microbatch`) and kept in checkpoints, so a
resumed run starts from it. Under data parallelism every rank computes its micro-batches
without synchronising, the ranks agree (one all-reduce of a flag) whether any ran out, and
retry together or average their gradients together.

Out of memory is CUDA's error on a GPU. On a CPU the kernel usually kills a process out of
memory instead of raising, so there `trainer.memory_limit` stands in for it: the bytes of
activations one micro-batch may save for its backward pass (what a step's memory grows
with); a micro-batch that saves more raises `torch.OutOfMemoryError` as a GPU would. It is
how `auto` is tested, and a way to bound a CPU run's memory.
"""
from __future__ import annotations

import contextlib
import math
import re

import torch

from .errors import ConfigError, HastenError


class ActivationLimitError(torch.OutOfMemoryError, HastenError):
    """A micro-batch saved more activations for backward than trainer.memory_limit allows: out
    of memory as a GPU would raise it (microbatch=auto halves and retries), and, when nothing
    smaller can be tried, hasten's one line saying what the limit allows and what was needed."""

    def __init__(self, limit: int, used: int, samples: "int | None", smallest: bool = False):
        self.limit, self.used, self.samples = limit, used, samples
        per = f", at least {used // samples:,} bytes a sample" if samples else ""
        what = f"a micro-batch of {samples} sample{'s' if samples != 1 else ''}" if samples else "a micro-batch"
        fix = (f"raise trainer.memory_limit to more than {used:,} bytes (one sample needs that much at least)"
               if smallest else "raise trainer.memory_limit, or give a smaller trainer.microbatch "
                                "(or trainer.microbatch=auto, which halves it until it fits)")
        super().__init__(f"out of memory (trainer.memory_limit): it allows {limit:,} bytes of activations a "
                         f"micro-batch saves for backward, and {what}{' even' if smallest else ''} saved more "
                         f"({used:,} bytes when it was stopped, partway through its forward{per}); {fix}")


class ModelDoesNotFit(torch.OutOfMemoryError, HastenError):
    """microbatch=auto reached micro-batches of one sample and the step still ran out of memory."""

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_bytes(value: "str | int | None", key: str = "trainer.memory_limit") -> int | None:
    """'512MB', '2GiB', 1000000 -> bytes; None stays None."""
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        if isinstance(value, int) and not 0 < value < 2**63:
            raise ConfigError(f"{key}={value}: give a positive size below 8 EiB, e.g. 512MB")
        return value
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"{key}={value!r}: write a size such as 512MB, 2GB or 1GiB")
    try:
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    except (ValueError, OverflowError):
        raise ConfigError(f"{key}={value!r}: write a size such as 512MB, 2GB or 1GiB") from None
    if n <= 0 or n >= 2**63:
        raise ConfigError(f"{key}={value!r}: give a positive size below 8 EiB, e.g. 512MB")
    return n


def size_problem(value) -> "str | None":
    """For the schema: why `value` is not a memory size (None when it is one)."""
    try:
        parse_bytes(value)
    except ConfigError as e:
        return "is not a size; " + str(e).split(": ", 1)[-1]
    return None


def check_microbatch(value) -> "int | str | None":
    """A micro-batch size (whole number >= 1), 'auto', or None."""
    if value is None or value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"microbatch={value!r}: give a whole number of samples >= 1, or 'auto'")
    return value


class ActivationBudget:
    """A context in which the tensors saved for backward may hold at most `limit` bytes; one
    more raises torch.OutOfMemoryError (trainer.memory_limit: out of memory on a CPU).
    `outer`, when given, is a context entered first and left last (the step's autocast), so
    the step enters one context, not two."""

    def __init__(self, limit: int, outer=None, samples: "int | None" = None):
        self.limit, self.used, self._seen, self.samples = limit, 0, set(), samples
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._outer = outer if outer is not None else contextlib.nullcontext()

    def _pack(self, t):
        # a tensor's own bytes, not its storage's: a micro-batch's input is a view into the
        # whole batch; a tensor saved twice (same address and size) is counted once
        if isinstance(t, torch.Tensor):
            key = (t.data_ptr(), t.numel(), t.dtype) if t.layout == torch.strided else id(t)
            if key in self._seen:
                return t
            self._seen.add(key)
            self.used += t.numel() * t.element_size()
            if self.used > self.limit:
                raise ActivationLimitError(self.limit, self.used, self.samples)
        return t

    def __enter__(self):
        self._outer.__enter__()
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return self._outer.__exit__(*exc)


WHOLE_BATCH = 2**31 - 1   # microbatch='auto' before any retry: every batch in one micro-batch


def initial_size(microbatch: "int | str | None") -> int | None:
    """state.microbatch at the start: the size given, the whole batch for 'auto', None without."""
    return WHOLE_BATCH if microbatch == "auto" else microbatch


def micro_count(n: int, size: int | None, grad_accum: int) -> int:
    """Micro-batches for a batch of `n` samples: by size when one is set, else grad_accum parts."""
    return grad_accum if size is None else max(1, math.ceil(n / size))


def halved(size: int, n: int) -> int:
    """The next micro-batch size after running out of memory at `size` with a batch of `n`."""
    current = min(size, n)
    if current <= 1:
        raise ModelDoesNotFit("out of memory with micro-batches of 1 sample: one sample's step does not fit in "
                              "memory (trainer.microbatch=auto can go no lower); use a smaller model or sequence, "
                              "activation checkpointing (trainer.activation_checkpointing=true), or more memory")
    return current // 2


class StepSnapshot:
    """What a step changes besides the gradients, kept so a retried step starts where the
    failed one did: the model's buffers and the random-number generators."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.buffers = [(b, b.detach().clone()) for b in model.buffers()]
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        self.device = device

    @torch.no_grad()
    def restore(self) -> None:
        for b, saved in self.buffers:
            b.copy_(saved)
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng, self.device)


def average_gradients(model: torch.nn.Module, world_size: int) -> None:
    """The data-parallel gradient average, by hand (each gradient divided by the world size and
    summed over the ranks, as DDP's default hook does): for steps whose micro-batches ran without
    DDP's synchronisation (microbatch auto)."""
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(world_size)
            torch.distributed.all_reduce(p.grad)
