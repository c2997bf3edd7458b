"""Weights & Biases logger (the `wandb` extra: pip install 'hasten[wandb]').

One W&B run per hasten run: metrics with hasten's batch as the step, the recipe (or the
hparams a Trainer is given) as its config. `mode="offline"` writes the run under `dir`
for `wandb sync` later (what the tests use; no account or network needed); the default
follows W&B's own settings (`WANDB_MODE`, `wandb login`). A resumed run continues the same
W&B run when given its `id` (hasten train keeps it in the run folder).
"""
from __future__ import annotations

import importlib.util

from .base import LoggerDestination, mapping_problem


OPTIONS = {"project": str, "name": str, "mode": str, "dir": str, "id": str, "entity": str, "tags": list}
MODES = ("online", "offline", "disabled", "shared")


def options_problem(options) -> "str | None":
    """What is wrong with trainer.wandb's mapping, by key (None: nothing)."""
    problem = mapping_problem(options, OPTIONS)
    if problem or options is None:
        return problem
    if options.get("mode") is not None and options["mode"] not in MODES:
        return f"has mode {options['mode']!r}, not one of {', '.join(MODES)}"
    return None


class WandbLogger(LoggerDestination):
    @staticmethod
    def available() -> bool:
        return importlib.util.find_spec("wandb") is not None

    def __init__(self, project: str = "hasten", name: str | None = None, mode: str | None = None,
                 dir: str | None = None, id: str | None = None, entity: str | None = None, tags: list | None = None):
        try:
            import wandb
        except ImportError as e:   # pragma: no cover - depends on the environment
            raise ImportError("WandbLogger needs wandb: pip install 'hasten[wandb]'") from e
        self.run = wandb.init(project=project, name=name, mode=mode, dir=dir, id=id, entity=entity, tags=tags,
                              resume="allow" if id else None, reinit="create_new")
        self.id = self.run.id
        # hasten's batch is a metric of its own that every other is plotted against: W&B's own step
        # only goes forward, and a resumed run logs batches after its checkpoint again
        self.run.define_metric("trainer/batch")
        self.run.define_metric("*", step_metric="trainer/batch")

    def log_metrics(self, metrics, step):
        self.run.log({**metrics, "trainer/batch": int(step)})

    def log_hparams(self, hparams):
        self.run.config.update(hparams, allow_val_change=True)

    def close(self):
        self.run.finish()
