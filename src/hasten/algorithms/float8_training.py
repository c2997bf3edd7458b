"""Float8 training: the matrix products of large Linear layers in float8, through torchao.

torchao's float8 training replaces `nn.Linear` with `Float8Linear`: its input, weight and the
gradient of its output are cast to float8 (e4m3 forward, e5m2 for the gradient) with a scale
per tensor (`recipe="tensorwise"`) or per row (`"rowwise"`), and multiplied by
`torch._scaled_mm`; weights, optimizer state and everything else stay as they were. On GPUs
with float8 units (H100 and newer) the products run at twice bf16's rate; elsewhere (a CPU,
older GPUs) `_scaled_mm` is emulated and it is slower.

Which layers: a product pays only when it is large enough for the casts to be a small part
of it. The rule here: a Linear is converted when both its input and output features are
multiples of 16 (the float8 kernels' alignment) and in_features x out_features is at least
`min_elements` (default 1,048,576 = 1024 x 1024); smaller layers (and the output head, by
name: `skip`) stay as they are. It composes with compilation (torchao's documented path, and
the fast one) and with FSDP2 (converted at INIT, before the model is sharded; `fsdp_all_gather`
gathers the weights in float8).

Functional form: `convert_to_float8(model, min_elements=..., recipe=..., skip=...)` returns
the names converted.
"""
from __future__ import annotations

import fnmatch
import importlib.util

import torch.nn as nn

from ..core import Algorithm
from ..registry import register_algorithm

RECIPES = ("tensorwise", "rowwise")


def float8_available() -> bool:
    return importlib.util.find_spec("torchao") is not None


def should_convert(module: nn.Module, name: str, min_elements: int, skip: tuple[str, ...] = ("*head*",)) -> bool:
    """The rule: an nn.Linear whose features are multiples of 16, with at least min_elements weights,
    and whose name matches none of `skip`."""
    return (isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0
            and module.in_features * module.out_features >= min_elements
            and not any(fnmatch.fnmatch(name, p) for p in skip))


def convert_to_float8(model: nn.Module, min_elements: int = 1 << 20, recipe: str = "tensorwise",
                      skip: tuple[str, ...] = ("*head*",), fsdp_all_gather: bool = False) -> list[str]:
    """In place: every Linear that passes `should_convert` becomes torchao's Float8Linear with the
    scaling `recipe`; returns the converted layers' names (the others are left as they are)."""
    if recipe not in RECIPES:
        raise ValueError(f"float8 recipe {recipe!r}: use one of {RECIPES}")
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training   # optional extra: compress (torchao)
    except ImportError as e:
        raise ImportError("float8 training needs torchao: pip install 'hasten[compress]'") from e
    chosen = [n for n, m in model.named_modules() if should_convert(m, n, min_elements, skip)]
    if not chosen:
        return []
    config = Float8LinearConfig.from_recipe_name(recipe)
    if fsdp_all_gather:
        config = Float8LinearConfig(**{**config.__dict__, "enable_fsdp_float8_all_gather": True})
    names = set(chosen)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: fqn in names)
    cpu_autocast = _cpu_autocast_class()
    for name in chosen:
        model.get_submodule(name).__class__ = cpu_autocast
    return chosen


_CPU_AUTOCAST_CLASS = None


def _cpu_autocast_class() -> type:
    """torchao's Float8Linear with CPU autocast handled: torchao casts the input to the
    autocast dtype for CUDA only, and under CPU autocast the float8 operands of its product
    were cast again by autocast (`aten.to.dtype`, which its float8 tensors refuse). Here the
    input is cast to CPU autocast's dtype and the layer runs with CPU autocast off, as torchao
    does on a GPU."""
    global _CPU_AUTOCAST_CLASS
    if _CPU_AUTOCAST_CLASS is None:
        import torch
        from torchao.float8.float8_linear import Float8Linear   # optional extra: compress (torchao)

        class Float8LinearCPUAutocast(Float8Linear):
            def forward(self, input):
                if input.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
                    dtype = torch.get_autocast_dtype("cpu")
                    with torch.autocast("cpu", enabled=False):
                        return super().forward(input.to(dtype))
                return super().forward(input)

        _CPU_AUTOCAST_CLASS = Float8LinearCPUAutocast
    return _CPU_AUTOCAST_CLASS


@register_algorithm("float8_training")
class Float8Training(Algorithm):
    def __init__(self, min_elements: int = 1 << 20, recipe: str = "tensorwise", skip: tuple = ("*head*",),
                 fsdp_all_gather: bool = True):
        if recipe not in RECIPES:
            raise ValueError(f"float8 recipe {recipe!r}: use one of {RECIPES}")
        if min_elements < 0:
            raise ValueError(f"min_elements must be >= 0, got {min_elements}")
        self.min_elements, self.recipe, self.skip = int(min_elements), recipe, tuple(skip)
        self.fsdp_all_gather = fsdp_all_gather
        self.converted: list[str] = []

    def init(self, state, logger):
        if state.precision not in ("bf16-mixed", "fp32"):
            raise ValueError(f"float8_training runs under bf16-mixed (or fp32), not {state.precision}")
        self.converted = convert_to_float8(state.model, self.min_elements, self.recipe, self.skip,
                                           self.fsdp_all_gather and state.runtime.world.sharded)
        if not self.converted:
            raise ValueError(f"float8_training: no Linear layer of the model has features that are multiples of 16 and "
                             f"at least {self.min_elements:,} weights (the rule for a product large enough to pay); "
                             "lower min_elements to convert smaller ones, or remove float8_training")
        logger.log({"float8_training/layers": len(self.converted)})


__all__ = ["convert_to_float8", "should_convert", "Float8Training"]
