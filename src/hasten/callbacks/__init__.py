"""Callbacks shipped with hasten: they observe training and never change it."""
from .checkpoint import Checkpoint
from .early_stopping import EarlyStopping
from .lr_monitor import LRMonitor
from .profile import Profile
from .progress import ProgressBar
from .speed_monitor import SpeedMonitor

__all__ = ["Checkpoint", "EarlyStopping", "LRMonitor", "Profile", "ProgressBar", "SpeedMonitor"]
