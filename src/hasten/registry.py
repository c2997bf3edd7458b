"""The registries that recipes name things from, filled by declaration where each thing is
defined: an algorithm by `@register_algorithm("name")` on its class, a model by
`@register_model("name")`, a task by `register_task(spec)` beside its spec. Nothing keeps a second list: `hasten.algorithms`
imports every module of its package (so adding a method is adding its module), and
`hasten.tasks` every task module; `hasten` imports both, so the registries are full
wherever a recipe is validated. Recipe names never change once published (they appear in
recipes, run folders and method cards), and an algorithm's registry name is its module's name.
"""
from __future__ import annotations

from typing import Any

ALGORITHMS: dict[str, type] = {}   # recipe name -> Algorithm class
TASKS: dict[str, Any] = {}         # task name or alias -> TaskSpec
MODELS: dict[str, Any] = {}        # model.name -> a model class or factory (the vision task's models)


def register_algorithm(name: str):
    """Class decorator: the Algorithm is `algorithms.NAME` in recipes (`registry_name` on the class)."""
    def register(cls):
        if ALGORITHMS.get(name, cls) is not cls:
            raise ValueError(f"algorithm name {name!r} is taken by {ALGORITHMS[name].__module__}.{ALGORITHMS[name].__name__}")
        ALGORITHMS[name] = cls
        cls.registry_name = name
        return cls
    return register


def register_model(name: str):
    """Decorator of a model class or factory: `model: {name: NAME, ...}` in recipes."""
    def register(fn):
        if MODELS.get(name, fn) is not fn:
            raise ValueError(f"model name {name!r} is taken by {MODELS[name].__module__}.{MODELS[name].__name__}")
        MODELS[name] = fn
        return fn
    return register


def register_task(spec):
    """Register a TaskSpec under its name and aliases; returns it."""
    for n in (spec.name, *spec.aliases):
        if TASKS.get(n, spec) is not spec:
            raise ValueError(f"task name {n!r} is taken by {TASKS[n].name}")
        TASKS[n] = spec
    return spec
