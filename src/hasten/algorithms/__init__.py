"""Speedup methods: each module holds a functional form and its Algorithm.

REGISTRY maps the names used in recipes to Algorithm classes.
"""
from .activation_swap import ActivationSwap, swap_activations
from .batch_size_warmup import BatchSizeWarmup, take_batch
from .blurpool import BlurPool, apply_blurpool, blur2d
from .cutmix import CutMix, cutmix_batch, cutmix_box
from .cutout import CutOut
from .dirac_init import DiracInit, dirac_init_
from .frozen_bn import FrozenBNScale, freeze_bn_scale
from .ghost_batchnorm import GhostBatchNorm, GhostBatchNormAlgorithm, apply_ghost_batchnorm, ghost_batch_norm
from .grad_clipping import GradientClipping, adaptive_clip_grad_
from .layer_freezing import LayerFreezing, freeze_first
from .lookahead import Lookahead, lookahead_sync
from .low_precision_layernorm import LowPrecisionLayerNorm, LPLayerNorm, low_precision_layer_norm
from .mixup import MixUp, mixed_loss, mixup_batch
from .pool_reorder import PoolReorder, reorder_pools
from .progressive_resizing import ProgressiveResizing, resize_batch, resize_scale
from .sam import SAM, sam_perturb, sam_restore
from .stochastic_depth import StochasticDepth, drop_path
from .swa import SWA
from .chunked_ce import ChunkedCrossEntropy, chunked_cross_entropy
from .channels_last import ChannelsLast, apply_channels_last
from .delay import Delay
from .ema import EMA, ema_update, ema_weight
from .infobatch import InfoBatch, InfoBatchPruner, infobatch_plan
from .label_smoothing import LabelSmoothing, smoothed_cross_entropy, smooth_labels
from .patch_whitening import PatchWhitening, fit_patch_whitening
from .proxy_selection import ProxySelection, proxy_select
from .selective_backprop import SelectiveBackprop, select_hardest
from .seq_len_warmup import SeqLenWarmup, reshape_sequences
from .tta import TTA, tta_logits
from ..compress.gradual import GradualPruning, cubic_sparsity, magnitude_masks

REGISTRY = {"ema": EMA, "delay": Delay, "seq_len_warmup": SeqLenWarmup, "batch_size_warmup": BatchSizeWarmup,
            "channels_last": ChannelsLast, "label_smoothing": LabelSmoothing, "patch_whitening": PatchWhitening,
            "tta": TTA, "infobatch": InfoBatch, "selective_backprop": SelectiveBackprop,
            "proxy_selection": ProxySelection, "activation_swap": ActivationSwap, "cutmix": CutMix,
            "cutout": CutOut, "dirac_init": DiracInit, "frozen_bn_scale": FrozenBNScale,
            "ghost_batchnorm": GhostBatchNormAlgorithm, "gradient_clipping": GradientClipping,
            "lookahead": Lookahead, "mixup": MixUp, "pool_reorder": PoolReorder,
            "progressive_resizing": ProgressiveResizing, "sam": SAM, "swa": SWA, "blurpool": BlurPool,
            "stochastic_depth": StochasticDepth, "layer_freezing": LayerFreezing,
            "chunked_cross_entropy": ChunkedCrossEntropy, "low_precision_layernorm": LowPrecisionLayerNorm,
            "gradual_pruning": GradualPruning}

# test instruments, not methods: no card, no functional form, no measured effect
INSTRUMENTS = frozenset({"delay"})

import types as _types

__all__ = sorted(n for n, v in list(globals().items())
                 if not n.startswith("_") and not isinstance(v, _types.ModuleType) and n != "annotations")
