"""Moved to hasten.algorithms.gradual_pruning (an Algorithm, like every other method); this
name stays for code written against hasten 0.1."""
from ..algorithms.gradual_pruning import *  # noqa: F401,F403
from ..algorithms.gradual_pruning import __all__  # noqa: F401
