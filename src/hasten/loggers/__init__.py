"""Where metrics go: console, JSONL, TensorBoard."""
from .base import LogHub, LoggerDestination
from .console import ConsoleLogger
from .jsonl import JSONLLogger
from .tensorboard import TensorBoardLogger

__all__ = ["ConsoleLogger", "JSONLLogger", "LogHub", "LoggerDestination", "TensorBoardLogger"]
