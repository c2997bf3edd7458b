"""Reference models, and a registry of them by name (used by recipes and proxies)."""
from .flops import forward_flops, training_flops_per_sample
from .gpt import GPT, GPTConfig
from .resnet import ResNet, ResNet9, resnet18, resnet50
from .speedrun import SpeedrunNet

from ..registry import MODELS   # name -> class or factory, filled by @register_model where each is defined


def build_model(name: str, **kwargs):
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    return MODELS[name](**kwargs)


__all__ = ["GPT", "GPTConfig", "MODELS", "ResNet", "ResNet9", "resnet18", "resnet50", "SpeedrunNet", "build_model", "forward_flops",
           "training_flops_per_sample"]
