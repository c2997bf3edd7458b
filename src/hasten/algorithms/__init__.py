"""Speedup methods: each module holds a functional form and its Algorithm.

REGISTRY maps the names used in recipes to Algorithm classes.
"""
from .delay import Delay
from .ema import EMA, ema_update

REGISTRY = {"ema": EMA, "delay": Delay}

__all__ = ["Delay", "EMA", "REGISTRY", "ema_update"]
