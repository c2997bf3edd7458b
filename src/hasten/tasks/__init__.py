"""Tasks: how a recipe's `model` and `data` sections become a model and dataloaders, and how
its runs are judged.

Each task is a `TaskSpec` (hasten.tasks.base) registered by its module (`register_task`); every
module of this package is imported here. `TASKS` maps every name (aliases included) to its
spec. The trainer knows nothing of tasks.
"""
import importlib as _importlib
import pkgutil as _pkgutil

from ..registry import TASKS
from .base import Built, DataSection, ModelSection, NamedModel, Quality, TaskSpec, first_inputs

for _m in sorted(_pkgutil.iter_modules(__path__)):
    if _m.name != "base":
        _importlib.import_module(f"{__name__}.{_m.name}")

SPECS = tuple(dict.fromkeys(TASKS.values()))   # each spec once, in registration order

__all__ = ["Built", "DataSection", "ModelSection", "NamedModel", "Quality", "SPECS", "TASKS", "TaskSpec", "first_inputs"]
