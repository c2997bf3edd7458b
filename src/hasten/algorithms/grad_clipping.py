"""Moved to hasten.algorithms.gradient_clipping (a method's module is named as its recipe name); this name
stays for code written against hasten 0.1."""
from .gradient_clipping import *  # noqa: F401,F403
from .gradient_clipping import __all__  # noqa: F401
