"""The time-to-quality harness behind `hasten bench`: runs, statistics, reports, ladders."""
from .compare import compare
from .report import analyse, markdown, write_report
from .runner import Spec, run_comparison
from .stats import describe, ratio_ci, welch_t_test
from .target import Target

__all__ = ["Spec", "Target", "analyse", "compare", "describe", "markdown", "ratio_ci", "run_comparison", "welch_t_test",
           "write_report"]
