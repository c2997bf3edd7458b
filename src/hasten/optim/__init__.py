"""Optimisation helpers: schedules in typed time and parameter-group rules."""
from .param_groups import apply_lr_multipliers, param_groups
from .schedules import LRSchedule

__all__ = ["LRSchedule", "apply_lr_multipliers", "param_groups"]
