"""Moved to hasten.algorithms.magnitude_pruning (the functional form of magnitude pruning,
used during training by gradual_pruning and after it by hasten compress); this name stays for
code written against hasten 0.1."""
from ..algorithms.magnitude_pruning import *  # noqa: F401,F403
from ..algorithms.magnitude_pruning import __all__  # noqa: F401
