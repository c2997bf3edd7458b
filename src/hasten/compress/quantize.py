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
  result is a graph module, not the original class. An artifact stores what makes the graph
  this model's (`static_state`: its int8 weights, scales, zero points and float biases, and the
  activations' quantization parameters written into its nodes), all plain tensors and numbers;
  loading rebuilds the graph's shape from the recipe's model and puts them back
  (`quantize_static_from`), so the loaded graph computes exactly what the saved one did.

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


def _attr(gm: nn.Module, target: str):
    owner, _, leaf = target.rpartition(".")
    return getattr(gm.get_submodule(owner) if owner else gm, leaf)


def _tensor_targets(gm) -> list[str]:
    """The names of the tensors the graph reads (its get_attr nodes that hold a tensor), in order."""
    return [n.target for n in gm.graph.nodes if n.op == "get_attr" and isinstance(_attr(gm, n.target), torch.Tensor)]


def _quant_nodes(gm) -> list:
    """The graph's quantize and dequantize calls (torch's quantized_decomposed ops), in order."""
    return [n for n in gm.graph.nodes
            if n.op == "call_function" and getattr(n.target, "namespace", None) == "quantized_decomposed"]


def _number(a):
    return a if type(a) in (int, float) else None


def static_state(gm: nn.Module) -> dict:
    """What makes an int8-static graph module (quantize_static's result) this model's, as plain
    tensors and numbers: `tensors`, every tensor the graph reads, by name (int8 weights, their
    per-channel scales and zero points, float biases and batch-norm parameters), and `numbers`,
    the scales and zero points written into each quantize and dequantize call as numbers (the
    activations'), in graph order. Float weights that the graph no longer reads are left out."""
    tensors = {name: _attr(gm, name).detach().clone() for name in _tensor_targets(gm)}
    numbers = [[str(n.target), [_number(a) for a in n.args]] for n in _quant_nodes(gm)]
    return {"tensors": tensors, "numbers": numbers}


@torch.no_grad()
def quantize_static_from(model: nn.Module, example: torch.Tensor, state: dict) -> nn.Module:
    """The int8-static graph module that `static_state` described: the graph is built from
    `model` (its class and shapes; its weights do not matter) on `example` inputs, then every
    tensor and number of `state` is put back. ValueError when the two graphs differ in shape (a
    model or a torch/torchao version that quantizes differently)."""
    return put_static_state(quantize_static(model, [example]), state)


@torch.no_grad()
def put_static_state(gm: nn.Module, state: dict) -> nn.Module:
    """Put `state` (static_state's) into the int8-static graph module `gm`, in place; ValueError,
    before anything is changed, when they differ in shape."""
    tensors, numbers = state["tensors"], state["numbers"]
    mine = set(_tensor_targets(gm))
    if mine != set(tensors):
        diff = sorted(mine ^ set(tensors))[:4]
        raise ValueError(f"the int8 graph this model quantizes to reads other tensors than the stored one ({diff})")
    nodes = _quant_nodes(gm)
    if [str(n.target) for n in nodes] != [t for t, _ in numbers]:
        raise ValueError("the int8 graph this model quantizes to has other quantize calls than the stored one")
    for name, t in tensors.items():
        cur = _attr(gm, name)
        if cur.shape != t.shape or cur.dtype != t.dtype:
            raise ValueError(f"{name}: stored {t.dtype} {tuple(t.shape)}, the graph has {cur.dtype} {tuple(cur.shape)}")
    for n, (_, args) in zip(nodes, numbers):
        if len(args) != len(n.args) or any((a is None) != (_number(b) is None) for a, b in zip(args, n.args)):
            raise ValueError(f"the arguments of {n.target} differ from the stored graph's")
    for name, t in tensors.items():
        _attr(gm, name).copy_(t)
    for n, (_, args) in zip(nodes, numbers):
        n.args = tuple(b if a is None else a for a, b in zip(args, n.args))
    gm.recompile()
    return gm


__all__ = ["MODES", "check_mode", "cpu_flags", "cpu_name", "int8_hardware", "quantize_linear", "quantize_static",
           "quantize_static_from", "put_static_state", "require_torchao", "static_state"]
