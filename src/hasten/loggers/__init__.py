"""Where metrics go: console, JSONL, TensorBoard, MLflow, Weights & Biases (the last three
through their extras)."""
from .base import LogHub, LoggerDestination
from .console import ConsoleLogger
from .jsonl import JSONLLogger
from .mlflow import MLflowLogger
from .tensorboard import TensorBoardLogger
from .wandb import WandbLogger

__all__ = ["ConsoleLogger", "JSONLLogger", "LogHub", "LoggerDestination", "MLflowLogger", "TensorBoardLogger",
           "WandbLogger"]
