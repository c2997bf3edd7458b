"""Every method's functional form, for use in any plain PyTorch loop:

    import hasten.functional as hf
    x, y = hf.reshape_sequences(x, y, 32)
    x = hf.random_translate(x, 2, generator)

Derived: every functional form each method module of `hasten.algorithms` exports (its
`__all__` but its Algorithm), and the data augmentations and optimizer helpers below.
"""
from . import algorithms as _algorithms
from .data.augment import (alternating_flip, brightness_contrast, cutout, flip_where, normalize,
                           random_brightness_contrast, random_flip, random_translate, translate)
from .optim.muon import muon_optimizers, split_for_muon
from .optim.param_groups import param_groups
from .optim.schedules import LRSchedule
from .optim.sgdw import SGDW, decoupled_hparams

for _module in _algorithms.MODULES:
    globals().update(_algorithms.functional_forms(_module))

__all__ = sorted(n for n in list(globals()) if not n.startswith("_") and n != "annotations")
