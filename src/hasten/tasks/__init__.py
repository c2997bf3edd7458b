"""Tasks: how a recipe's `model` and `data` sections become a model and dataloaders.

Each task is a `TaskSpec` (hasten.tasks.base): its data and model config classes, the
function that validates its `model` section, and its builder `build(recipe, runtime)`.
The trainer knows nothing of tasks. `TASKS` maps every name (aliases included) to its spec.
"""
from .base import Built, NamedModel, TaskSpec
from .char_lm import SPEC as CHAR_LM
from .image_classification import SPEC as IMAGE_CLASSIFICATION

SPECS = (CHAR_LM, IMAGE_CLASSIFICATION)
TASKS: dict[str, TaskSpec] = {n: spec for spec in SPECS for n in (spec.name, *spec.aliases)}

__all__ = ["Built", "NamedModel", "SPECS", "TASKS", "TaskSpec"]
