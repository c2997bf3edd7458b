"""Every method's functional form, for use in any plain PyTorch loop:

    import hasten.functional as hf
    x, y = hf.reshape_sequences(x, y, 32)
    x = hf.random_translate(x, 2, generator)
"""
from .algorithms.activation_swap import swap_activations
from .algorithms.batch_size_warmup import take_batch
from .algorithms.blurpool import apply_blurpool, blur2d
from .algorithms.cutmix import cutmix_batch, cutmix_box
from .algorithms.dirac_init import dirac_init_
from .algorithms.frozen_bn import freeze_bn_scale
from .algorithms.ghost_batchnorm import apply_ghost_batchnorm, ghost_batch_norm
from .algorithms.grad_clipping import adaptive_clip_grad_
from .algorithms.layer_freezing import freeze_first
from .algorithms.lookahead import lookahead_sync
from .algorithms.low_precision_layernorm import apply_low_precision_layernorm, low_precision_layer_norm
from .algorithms.mixup import mixed_loss, mixup_batch
from .algorithms.pool_reorder import reorder_pools
from .algorithms.progressive_resizing import resize_batch, resize_scale
from .algorithms.sam import sam_perturb, sam_restore
from .algorithms.stochastic_depth import drop_path
from .algorithms.swa import apply_swa
from .algorithms.channels_last import apply_channels_last
from .algorithms.chunked_ce import chunked_cross_entropy
from .algorithms.ema import ema_update, ema_weight
from .algorithms.infobatch import InfoBatchPruner, infobatch_plan
from .algorithms.label_smoothing import smooth_labels, smoothed_cross_entropy, uniform_cross_entropy
from .algorithms.patch_whitening import fit_patch_whitening, patch_covariance
from .algorithms.proxy_selection import proxy_select
from .algorithms.selective_backprop import select_hardest
from .algorithms.seq_len_warmup import reshape_sequences, warmup_length
from .algorithms.tta import tta_logits
from .compress.gradual import cubic_sparsity, magnitude_masks
from .data.augment import alternating_flip, cutout, flip_where, normalize, random_flip, random_translate, translate
from .optim.muon import muon_optimizers, split_for_muon
from .optim.param_groups import param_groups
from .optim.schedules import LRSchedule
from .optim.sgdw import SGDW, decoupled_hparams

import types as _types

__all__ = sorted(n for n, v in list(globals().items())
                 if not n.startswith("_") and not isinstance(v, _types.ModuleType) and n != "annotations")
