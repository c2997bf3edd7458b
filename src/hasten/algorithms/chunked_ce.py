"""Moved to hasten.algorithms.chunked_cross_entropy (a method's module is named as its recipe name); this name
stays for code written against hasten 0.1."""
from .chunked_cross_entropy import *  # noqa: F401,F403
from .chunked_cross_entropy import __all__  # noqa: F401
