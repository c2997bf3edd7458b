"""Targets: 'val/acc>=0.908', 'val/loss<=1.9', or a target taken from the first recipe's
runs in the same bench:

- 'val/loss<=@first-worst': the first recipe's worst final value (the largest loss, the
  smallest accuracy), so every finished run of the first recipe reaches it: the rule
  hasten's own comparisons use;
- 'val/loss<=@first': the first recipe's mean final value; about half of its own runs
  miss it by construction (they are counted as censored, see hasten.bench.survival).

Without a metric ('@first-worst', the default of `hasten bench`, or '@first') the metric and
its direction are the first recipe's task's (TaskSpec.quality: accuracy up, loss down).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError

_T = re.compile(r"^\s*([\w/.\-]+)\s*(>=|<=)\s*(@first-worst|@first|[-+0-9.eE]+)\s*$")
_TASK = re.compile(r"^\s*(@first-worst|@first)\s*$")
RULES = {"@first": "mean", "@first-worst": "worst"}


@dataclass
class Target:
    metric: str
    op: str                  # ">=" or "<="
    value: float | None      # None until resolved when it comes from the first recipe
    from_first: bool = False
    rule: str = "mean"       # from the first recipe: its runs' "mean" or "worst" final value

    @classmethod
    def parse(cls, text: str) -> "Target":
        bare = _TASK.match(text)
        if bare:   # the metric and direction come from the first recipe's task (for_task)
            return cls("", "", None, True, RULES[bare.group(1)])
        m = _T.match(text)
        if not m:
            raise ConfigError(f"cannot read target {text!r}: write METRIC>=VALUE or METRIC<=VALUE "
                              "(e.g. 'val/acc>=0.908'), or METRIC<=@first-worst (the first recipe's worst final "
                              "value: every one of its runs reaches it) or METRIC<=@first (its mean), or @first-worst "
                              "alone (the task's own metric)")
        metric, op, v = m.groups()
        if v in RULES:
            return cls(metric, op, None, True, RULES[v])
        return cls(metric, op, float(v))

    def for_task(self, quality) -> "Target":
        """This target with the task's metric and direction filled in where it names none."""
        if self.metric:
            return self
        return Target(quality.metric, quality.op, self.value, self.from_first, self.rule)

    def reached(self, value: float) -> bool:
        return value >= self.value if self.op == ">=" else value <= self.value

    def __str__(self) -> str:
        token = "@first-worst" if self.rule == "worst" else "@first"
        v = token if self.value is None else f"{self.value:.6g}"
        what = "worst" if self.rule == "worst" else "mean"
        return f"{self.metric}{self.op}{v}" + (f" (first recipe's {what})" if self.from_first and self.value is not None else "")
