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

# old module names kept for code written against hasten 0.1 (each re-exports its new module)
MOVED = {"grad_clipping": "gradient_clipping", "frozen_bn": "frozen_bn_scale", "chunked_ce": "chunked_cross_entropy"}
# test instruments, not methods: no card, no functional form, no measured effect
INSTRUMENTS = frozenset({"delay"})

MODULES = tuple(_importlib.import_module(f"{__name__}.{m.name}") for m in sorted(_pkgutil.iter_modules(__path__))
                if m.name not in MOVED and not m.name.startswith("_"))
for _module in MODULES:
    globals().update({_name: getattr(_module, _name) for _name in _module.__all__})


def functional_forms(module) -> dict:
    """The functional forms a method module exports: everything in its `__all__` but its Algorithm(s)."""
    return {n: getattr(module, n) for n in module.__all__
            if not (isinstance(getattr(module, n), type) and issubclass(getattr(module, n), _Algorithm))}


__all__ = sorted(["INSTRUMENTS", "MODULES", "MOVED", "REGISTRY", "functional_forms",
                  *(n for m in MODULES for n in m.__all__)])
