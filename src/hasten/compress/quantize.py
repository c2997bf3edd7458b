"""Post-training int8 quantization through torchao (no kernels of hasten's own).

Modes:
- `int8`: int8 weights and dynamically quantized int8 activations for Linear layers
  (torchao `Int8DynamicActivationInt8WeightConfig`). Fast on x86 CPUs with VNNI or AMX once
  compiled (`torch.compile` with inductor's freezing lowers it to int8 matrix products); in
  eager mode it is slower than fp32. What a GPT needs.
- `int8-weight`: int8 weights, float activations, Linear layers (`Int8WeightOnlyConfig`).
  Saves memory and bytes; on a CPU it rarely saves time (the product still runs in float).
- `int8-static`: statically quantized int8 convolutions and linears for x86 through the PT2E
  flow (torch.export, torchao's `X86InductorQuantizer`, calibration on real batches,
  `convert_pt2e`), the supported path for convolutions on x86 CPUs; run it compiled. The
  result is a graph module, not the original class: it is stored as float weights plus the
  calibration batch and re-quantized (deterministically) when an artifact is loaded.

torchao is an extra (`pip install 'hasten[compress]'`); every mode says so when it is missing.
"""
from __future__ import annotations

import platform
import warnings

import torch
import torch.nn as nn

from ..hardware import cpu_flags, cpu_name

MODES = ("int8", "int8-weight", "int8-static")


def int8_hardware() -> str:
    """What this CPU offers int8 matrix products: 'amx', 'vnni' or 'none'."""
    flags = cpu_flags()
    if "amx_int8" in flags:
        return "amx"
    if flags & {"avx512_vnni", "avx_vnni"}:
        return "vnni"
    return "none"


def require_torchao():
    import logging
    quiet = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]   # its CUDA-only libraries
    levels = [q.level for q in quiet]                                            # complain on a CPU
    try:
        for q in quiet:
            q.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchao
    except ImportError:
        raise ImportError("quantization needs torchao: pip install 'hasten[compress]' (or pip install torchao)") from None
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    return torchao


def check_mode(mode: str) -> str:
    """A quantization mode this machine can run, or a one-line ValueError."""
    if mode not in MODES:
        raise ValueError(f"unknown quantization {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "int8-static" and platform.machine().lower() not in ("x86_64", "amd64", "i686"):
        raise ValueError(f"int8-static uses torchao's X86InductorQuantizer, for x86 CPUs; this machine is "
                         f"{platform.machine()}: use int8 or int8-weight")
    require_torchao()
    return mode


def _linear_filter(min_features: int):
    def keep(module: nn.Module, fqn: str) -> bool:
        return isinstance(module, nn.Linear) and min(module.in_features, module.out_features) >= min_features
    return keep


def quantize_linear(model: nn.Module, mode: str = "int8", min_features: int = 16) -> int:
    """Quantize the model's Linear layers in place (`int8` or `int8-weight`); layers narrower
    than `min_features` stay float (a 10-class head gains nothing). Returns the number of
    layers quantized. A weight tied to an embedding is untied: the Linear gets the int8 copy."""
    check_mode(mode)
    if mode == "int8-static":
        raise ValueError("int8-static is a graph transformation: use quantize_static(model, example_inputs)")
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_
    keep = _linear_filter(min_features)
    count = sum(1 for n, m in model.named_modules() if keep(m, n))
    if count:
        cfg = Int8DynamicActivationInt8WeightConfig() if mode == "int8" else Int8WeightOnlyConfig()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_(model, cfg, filter_fn=keep)
    return count


@torch.no_grad()
def quantize_static(model: nn.Module, calibration: list[torch.Tensor]) -> nn.Module:
    """An int8 graph module of `model` for x86 CPUs (PT2E with torchao's X86InductorQuantizer,
    default per-channel weights and per-tensor activations), calibrated on the batches in
    `calibration`. Deterministic for the same weights and batches. Run it under
    `torch.compile` (with `torch._inductor.config.freezing = True`) for int8 kernels."""
    check_mode("int8-static")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq
    if not calibration:
        raise ValueError("int8-static needs at least one calibration batch")
    model = model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = torch.export.Dim("batch", min=1)   # any batch size (evaluation subsets, batch 1)
        exported = torch.export.export(model, (calibration[0],), dynamic_shapes=({0: batch},), strict=False).module()
        quantizer = xiq.X86InductorQuantizer()
        quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
        prepared = prepare_pt2e(exported, quantizer)
        for x in calibration:
            prepared(x)
        from torchao.quantization.pt2e import allow_exported_model_train_eval
        converted = convert_pt2e(prepared)
        allow_exported_model_train_eval(converted)   # .eval() as on any model (it has no dropout to switch)
        return converted


__all__ = ["MODES", "check_mode", "cpu_flags", "cpu_name", "int8_hardware", "quantize_linear", "quantize_static",
           "require_torchao"]
