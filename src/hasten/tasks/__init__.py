"""Tasks: how a recipe's `model` and `data` sections become a model and dataloaders.

Each task module defines `DataConfig` (a dataclass), `model_config(raw) -> config` and
`build(recipe) -> Built`. The trainer knows nothing of tasks.
"""
from . import char_lm, image_classification

TASKS = {"char_lm": char_lm, "lm": char_lm, "image_classification": image_classification}
