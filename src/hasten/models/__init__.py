"""Reference models, and a registry of the vision task's models by name (used by recipes and proxies)."""
import torch

from ..registry import MODELS   # name -> class or factory, filled by @register_model where each is defined
from .bert import BERT, BertClassifier, BertConfig
from .flops import forward_flops, training_flops_per_sample
from .gpt import GPT, GPTConfig
from .resnet import ResNet, ResNet9, resnet18, resnet50
from .speedrun import SpeedrunNet
from .vit import ViT


def has_batch_norm(model) -> bool:
    """Whether any layer of `model` normalises over the batch (torch's batch-norm family), so
    that its statistics depend on which samples share a batch."""
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


def build_model(name: str, **kwargs):
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    return MODELS[name](**kwargs)


__all__ = ["BERT", "BertClassifier", "BertConfig", "GPT", "GPTConfig", "MODELS", "ResNet", "ResNet9", "SpeedrunNet",
           "ViT", "build_model", "forward_flops", "resnet18", "resnet50", "training_flops_per_sample"]
