"""Optimisation helpers: schedules in typed time and parameter-group rules."""
from .param_groups import apply_lr_multipliers, param_groups
from .muon import ConvMuon, muon_optimizers, newton_schulz, ns_dtype_for, split_for_muon
from .schedules import LRSchedule

__all__ = ["ConvMuon", "LRSchedule", "muon_optimizers", "newton_schulz", "ns_dtype_for", "split_for_muon", "apply_lr_multipliers", "param_groups"]
