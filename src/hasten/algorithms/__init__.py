"""Speedup methods: each module holds a functional form and its Algorithm.

REGISTRY maps the names used in recipes to Algorithm classes.
"""
from .batch_size_warmup import BatchSizeWarmup, take_batch
from .delay import Delay
from .ema import EMA, ema_update
from .seq_len_warmup import SeqLenWarmup, reshape_sequences

REGISTRY = {"ema": EMA, "delay": Delay, "seq_len_warmup": SeqLenWarmup, "batch_size_warmup": BatchSizeWarmup}

__all__ = ["BatchSizeWarmup", "Delay", "EMA", "REGISTRY", "SeqLenWarmup", "ema_update", "reshape_sequences",
           "take_batch"]
