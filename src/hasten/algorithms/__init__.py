"""Speedup methods: each module holds a functional form and its Algorithm.

REGISTRY maps the names used in recipes to Algorithm classes.
"""
from .batch_size_warmup import BatchSizeWarmup, take_batch
from .channels_last import ChannelsLast, apply_channels_last
from .delay import Delay
from .ema import EMA, ema_update
from .infobatch import InfoBatch, InfoBatchPruner, infobatch_plan
from .label_smoothing import LabelSmoothing, smoothed_cross_entropy, smooth_labels
from .patch_whitening import PatchWhitening, fit_patch_whitening
from .proxy_selection import ProxySelection, proxy_select
from .selective_backprop import SelectiveBackprop, select_hardest
from .seq_len_warmup import SeqLenWarmup, reshape_sequences
from .tta import TTA, tta_logits

REGISTRY = {"ema": EMA, "delay": Delay, "seq_len_warmup": SeqLenWarmup, "batch_size_warmup": BatchSizeWarmup,
            "channels_last": ChannelsLast, "label_smoothing": LabelSmoothing, "patch_whitening": PatchWhitening,
            "tta": TTA, "infobatch": InfoBatch, "selective_backprop": SelectiveBackprop,
            "proxy_selection": ProxySelection}

__all__ = ["BatchSizeWarmup", "ChannelsLast", "Delay", "EMA", "InfoBatch", "InfoBatchPruner", "LabelSmoothing",
           "PatchWhitening", "ProxySelection", "REGISTRY", "SelectiveBackprop", "SeqLenWarmup", "TTA",
           "apply_channels_last", "ema_update", "fit_patch_whitening", "infobatch_plan", "proxy_select",
           "reshape_sequences", "select_hardest", "smooth_labels", "smoothed_cross_entropy", "take_batch",
           "tta_logits"]
