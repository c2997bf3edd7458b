"""Every method's functional form, for use in any plain PyTorch loop:

    import hasten.functional as hf
    x, y = hf.reshape_sequences(x, y, 32)
"""
from .algorithms.batch_size_warmup import take_batch
from .algorithms.ema import ema_update
from .algorithms.seq_len_warmup import reshape_sequences, warmup_length
from .optim.muon import muon_optimizers, split_for_muon
from .optim.param_groups import param_groups
from .optim.schedules import LRSchedule

__all__ = ["LRSchedule", "ema_update", "muon_optimizers", "param_groups", "reshape_sequences", "split_for_muon",
           "take_batch", "warmup_length"]
