"""Console logger: prints evaluation results (and, if asked, training metrics) as one line."""
from __future__ import annotations

from rich.console import Console

from .base import LoggerDestination, fmt


class ConsoleLogger(LoggerDestination):
    def __init__(self, train_metrics: bool = False, console: Console | None = None):
        self.train_metrics = train_metrics
        self.console = console or Console(highlight=False, soft_wrap=True)

    def log_metrics(self, metrics, step):
        shown = {k: v for k, v in metrics.items()
                 if self.train_metrics or not k.startswith(("train/", "throughput/", "lr/", "time/"))}
        if shown:
            self.console.print(f"step {step}: " + "  ".join(f"{k}={fmt(v)}" for k, v in shown.items()), markup=False)
