"""Learning-rate schedules as functions of training progress (typed time), not step counters.

A schedule sets `lr = initial_lr * factor(progress)` for every parameter group before each
step, where progress is the fraction of max_duration done. Warm-up and warm-down lengths
are typed times ('100ba', '2ep', '0.1dur'), resolved against max_duration, so a schedule
still ends where it should when epoch lengths change (dynamic data pruning).

    LRSchedule("cosine", warmup="100ba", min_factor=0.1)    # warm-up, then cosine to 10%
    LRSchedule("linear", warmup="2ep")                     # warm-up, then linear to 0
    LRSchedule("wsd", warmup="0.05dur", warmdown="0.2dur")  # warm-up, stable, linear warm-down
    LRSchedule("linear", warmup="0.23dur", start_factor=0.2, min_factor=0.07)  # a triangle

The warm-up rises linearly from `start_factor` (default 0: from one step's worth of the rate)
to the full rate; after it, the rate falls to `min_factor` by the end of the run.
"""
from __future__ import annotations

import math

from ..core import Time
from .compiled import lr_value, set_lr

KINDS = ("constant", "linear", "cosine", "wsd")


class LRSchedule:
    """A learning-rate factor as a function of training progress: `kind` cosine, linear, constant or
    wsd (warm-up, stable, decay over `warmdown`), a linear warm-up from `start_factor` over `warmup`
    (typed time), decaying to `min_factor`. The Trainer multiplies each group's base rate by it
    every batch; `schedule(progress)` gives the factor."""
    def __init__(self, kind: str = "cosine", warmup: "str | Time" = "0ba", warmdown: "str | Time | None" = None,
                 min_factor: float = 0.0, start_factor: float = 0.0):
        if kind not in KINDS:
            raise ValueError(f"unknown schedule {kind!r}: use one of {KINDS}")
        if kind == "wsd" and warmdown is None:
            raise ValueError("the 'wsd' schedule needs warmdown= (e.g. '0.2dur')")
        if not 0.0 <= min_factor <= 1.0:
            raise ValueError(f"min_factor must lie in [0, 1], got {min_factor}")
        if not 0.0 <= start_factor <= 1.0:
            raise ValueError(f"start_factor must lie in [0, 1], got {start_factor}")
        self.kind, self.min_factor, self.start_factor = kind, min_factor, start_factor
        self.warmup = Time.parse(warmup)
        self.warmdown = Time.parse(warmdown) if warmdown is not None else None

    def factor(self, p: float, warm: float, down: float = 0.0, step: float = 0.0) -> float:
        """The multiplier at progress p in [0, 1]; `step` is one batch as a fraction of the run
        (the warm-up reaches full rate at its last step instead of starting at zero)."""
        if warm > 0 and p < warm:
            ramp = min(1.0, (p + step) / (warm + step))
            return self.start_factor + (1.0 - self.start_factor) * ramp
        lo = self.min_factor
        if self.kind == "constant":
            return 1.0
        if self.kind == "wsd":
            start = 1.0 - down
            if p < start:
                return 1.0
            d = (p - start) / max(down, 1e-12)
            return 1.0 - min(d, 1.0) * (1.0 - lo)
        d = min(max((p - warm) / max(1.0 - warm, 1e-12), 0.0), 1.0)
        if self.kind == "linear":
            return 1.0 - d * (1.0 - lo)
        return lo + 0.5 * (1.0 + math.cos(math.pi * d)) * (1.0 - lo)

    def apply(self, state) -> None:
        warm = state.fraction_of(self.warmup) if self.warmup.value else 0.0
        down = state.fraction_of(self.warmdown) if self.warmdown is not None else 0.0
        f = self.factor(state.progress, warm, down, state.batch_fraction())
        for opt in state.optimizers:
            for g in opt.param_groups:
                if "initial_lr" not in g:
                    g["initial_lr"] = lr_value(g)
                set_lr(g, g["initial_lr"] * f)   # in place when held as a tensor (compiled optimizer steps)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        pass

    def __repr__(self) -> str:
        return f"LRSchedule({self.kind!r}, warmup='{self.warmup}', warmdown={self.warmdown}, min_factor={self.min_factor}, start_factor={self.start_factor})"
