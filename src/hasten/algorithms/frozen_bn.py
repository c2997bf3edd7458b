"""Moved to hasten.algorithms.frozen_bn_scale (a method's module is named as its recipe name); this name
stays for code written against hasten 0.1."""
from .frozen_bn_scale import *  # noqa: F401,F403
from .frozen_bn_scale import __all__  # noqa: F401
