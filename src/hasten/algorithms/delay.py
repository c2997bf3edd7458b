"""Delay: sleeps a fixed time every step. A test instrument, not a speedup: it lets the
benchmark harness prove that it detects a known slowdown (see docs/bench.md)."""
from __future__ import annotations

import time

from ..core import Algorithm
from ..registry import register_algorithm


@register_algorithm("delay")
class Delay(Algorithm):
    def __init__(self, seconds: float = 0.01):
        if seconds < 0:
            raise ValueError("seconds must be >= 0")
        self.seconds = seconds

    def batch_start(self, state, logger):
        time.sleep(self.seconds)


__all__ = ["Delay"]
