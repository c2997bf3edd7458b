"""TensorBoard logger (needs the `tensorboard` extra: pip install 'hasten[tensorboard]')."""
from __future__ import annotations

import importlib.util
import json

from .base import LoggerDestination


class TensorBoardLogger(LoggerDestination):
    @staticmethod
    def available() -> bool:
        """Whether the tensorboard package is installed (the logger needs it)."""
        return importlib.util.find_spec("tensorboard") is not None

    def __init__(self, log_dir: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("TensorBoardLogger needs the tensorboard package: "
                              "pip install 'hasten[tensorboard]'") from e
        self.log_dir = str(log_dir)
        self._w = SummaryWriter(self.log_dir)

    def log_metrics(self, metrics, step):
        for k, v in metrics.items():
            self._w.add_scalar(k, v, step)

    def log_hparams(self, hparams):
        self._w.add_text("hparams", "```\n" + json.dumps(hparams, indent=2, default=str) + "\n```")

    def close(self):
        self._w.close()
