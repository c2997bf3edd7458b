"""Every method's functional form, for use in any plain PyTorch loop:

    import hasten.functional as hf
    x, y = hf.reshape_sequences(x, y, 32)
    x = hf.random_translate(x, 2, generator)
"""
from .algorithms.batch_size_warmup import take_batch
from .algorithms.channels_last import apply_channels_last
from .algorithms.ema import ema_update
from .algorithms.infobatch import InfoBatchPruner, infobatch_plan
from .algorithms.label_smoothing import smooth_labels, smoothed_cross_entropy
from .algorithms.patch_whitening import fit_patch_whitening, patch_covariance
from .algorithms.proxy_selection import proxy_select
from .algorithms.selective_backprop import select_hardest
from .algorithms.seq_len_warmup import reshape_sequences, warmup_length
from .algorithms.tta import tta_logits
from .data.augment import alternating_flip, cutout, flip_where, normalize, random_flip, random_translate, translate
from .optim.muon import muon_optimizers, split_for_muon
from .optim.param_groups import param_groups
from .optim.schedules import LRSchedule

__all__ = ["InfoBatchPruner", "LRSchedule", "alternating_flip", "apply_channels_last", "cutout", "ema_update",
           "fit_patch_whitening", "flip_where", "infobatch_plan", "muon_optimizers", "normalize", "param_groups",
           "patch_covariance", "proxy_select", "random_flip", "random_translate", "reshape_sequences",
           "select_hardest", "smooth_labels", "smoothed_cross_entropy", "split_for_muon", "take_batch",
           "translate", "tta_logits", "warmup_length"]
