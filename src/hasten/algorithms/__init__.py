"""Speedup methods: each module holds a functional form and its Algorithm.

REGISTRY maps the names used in recipes to Algorithm classes.
"""
from .ema import EMA, ema_update

REGISTRY = {"ema": EMA}

__all__ = ["EMA", "REGISTRY", "ema_update"]
