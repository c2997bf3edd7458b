"""Sequence-length warm-up: train on short sequences first, then lengthen them.

Functional form: `reshape_sequences(inputs, targets, length)` cuts every sequence of a
(batch, T) pair into T // length sequences of `length` tokens: no token is dropped, the
batch just holds more, shorter rows (T must be a multiple of `length`). Short sequences
make early steps cheaper (attention is quadratic in length) and, per Li et al. (2022,
"The stability-efficiency dilemma"), stabilise large learning rates early on.

The Algorithm grows the length linearly from `start` to the data's length over
`duration` (typed time), in multiples of `step`.
"""
from __future__ import annotations

import torch

from ..core import Algorithm, Time
from ..data.batches import describe_inputs
from ..registry import register_algorithm


def reshape_sequences(inputs: torch.Tensor, targets: torch.Tensor, length: int):
    """Cut every (B, T) sequence of `inputs` and `targets` into T / length pieces: (B * T / length,
    length) each, the same tokens in shorter windows. T must be a multiple of `length`; a `length`
    of T or more returns them unchanged."""
    B, T = inputs.shape[:2]
    if length >= T:
        return inputs, targets
    if T % length:
        raise ValueError(f"sequence length {T} is not a multiple of {length}")
    return inputs.reshape(B * (T // length), length), targets.reshape(B * (T // length), length)


def warmup_length(progress_fraction: float, start: int, end: int, step: int) -> int:
    """Length at a fraction of the warm-up: linear from start to end, rounded down to a
    multiple of step, and to a divisor of end."""
    length = start + (end - start) * min(max(progress_fraction, 0.0), 1.0)
    length = max(step, int(length // step * step))
    while end % length:
        length -= step
    return max(length, 1)


@register_algorithm("seq_len_warmup")
class SeqLenWarmup(Algorithm):
    def __init__(self, start: int = 8, step: int = 8, duration: str = "0.3dur"):
        if start < 1 or step < 1:
            raise ValueError("start and step must be >= 1")
        self.start, self.step, self.duration = start, step, Time.parse(duration)

    def batch_variants(self, state, batch) -> list:
        """The batch at every sequence length of the warm-up, the full length included
        (compiled runs warm them up)."""
        x, y = batch[0], batch[1]
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            return []
        lengths = {warmup_length(i / 64, self.start, x.shape[1], self.step) for i in range(65)} | {x.shape[1]}
        return [reshape_sequences(x, y, n) for n in sorted(lengths)]

    def after_dataloader(self, state, logger):
        p = state.progress_through(self.duration)
        if p >= 1.0:
            return
        x, y = state.batch
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.is_floating_point():
            raise ValueError(f"seq_len_warmup needs batches of token ids (batch, length); these inputs are "
                             f"{describe_inputs(x)}: remove seq_len_warmup from the algorithms")
        length = warmup_length(p, self.start, x.shape[1], self.step)
        state.batch = reshape_sequences(x, y, length)


__all__ = ["reshape_sequences", "warmup_length", "SeqLenWarmup"]
