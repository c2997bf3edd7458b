"""Targets: 'val/acc>=0.908', 'val/loss<=1.9', or 'val/loss<=@first' (the first recipe's
mean final value of that metric, measured in the same bench)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError

_T = re.compile(r"^\s*([\w/.\-]+)\s*(>=|<=)\s*(@first|[-+0-9.eE]+)\s*$")


@dataclass
class Target:
    metric: str
    op: str                  # ">=" or "<="
    value: float | None      # None until resolved when it is '@first'
    from_first: bool = False

    @classmethod
    def parse(cls, text: str) -> "Target":
        m = _T.match(text)
        if not m:
            raise ConfigError(f"cannot read target {text!r}: write METRIC>=VALUE or METRIC<=VALUE "
                             "(e.g. 'val/acc>=0.908'), or METRIC<=@first to use the first recipe's mean final value")
        metric, op, v = m.groups()
        if v == "@first":
            return cls(metric, op, None, True)
        return cls(metric, op, float(v))

    def reached(self, value: float) -> bool:
        return value >= self.value if self.op == ">=" else value <= self.value

    def __str__(self) -> str:
        v = "@first" if self.value is None else f"{self.value:.6g}"
        return f"{self.metric}{self.op}{v}" + (" (first recipe's mean)" if self.from_first and self.value is not None else "")
