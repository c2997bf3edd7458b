"""Speedup methods: each module holds a method's functional form and its Algorithm.

Adding a method is adding its module: every module of this package is imported here, each
Algorithm registers itself under its recipe name with `@register_algorithm("name")` (the
module's own name), and each module's `__all__` lists what it exports; `REGISTRY` (recipe
name -> class) and `hasten.functional` (every functional form) are derived from them.
"""
import importlib as _importlib
import pkgutil as _pkgutil

from ..core import Algorithm as _Algorithm
from ..registry import ALGORITHMS as REGISTRY

# test instruments, not methods: no card, no functional form, no measured effect
INSTRUMENTS = frozenset({"delay"})

MODULES = tuple(_importlib.import_module(f"{__name__}.{m.name}") for m in sorted(_pkgutil.iter_modules(__path__))
                if not m.name.startswith("_"))
for _module in MODULES:
    globals().update({_name: getattr(_module, _name) for _name in _module.__all__})


def functional_forms(module) -> dict:
    """The functional forms a method module exports: everything in its `__all__` but its Algorithm(s)."""
    return {n: getattr(module, n) for n in module.__all__
            if not (isinstance(getattr(module, n), type) and issubclass(getattr(module, n), _Algorithm))}


__all__ = sorted(["INSTRUMENTS", "MODULES", "REGISTRY", "functional_forms",
                  *(n for m in MODULES for n in m.__all__)])
