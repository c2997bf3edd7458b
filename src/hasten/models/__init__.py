"""Reference models."""
from .flops import forward_flops, training_flops_per_sample
from .gpt import GPT, GPTConfig
from .resnet import ResNet9

__all__ = ["GPT", "GPTConfig", "ResNet9", "forward_flops", "training_flops_per_sample"]
