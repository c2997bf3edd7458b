"""What this machine's CPU can do: its name and feature flags, and whether it computes bf16
in hardware (which decides whether bf16-mixed is fast here or emulated and slow)."""
from __future__ import annotations

import functools
import os
import platform

BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# the features that decide which precision and which int8 kernels are fast here
SPEED_CPU_FLAGS = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile",
                             "avx512_vnni", "avx_vnni"})


@functools.cache
def cpu_flags() -> frozenset:
    """The CPU's feature flags as Linux reports them (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("flags"):
                    return frozenset(ln.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_features() -> list[str]:
    """This CPU's flags among those that decide what is fast here (SPEED_CPU_FLAGS), sorted: what
    a measurement records so it is read against the right kind of machine."""
    return sorted(cpu_flags() & SPEED_CPU_FLAGS)


# environment variables that cap the instruction sets of torch's CPU kernels (oneDNN's, ATen's)
KERNEL_CAP_VARS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")


def kernel_caps() -> dict[str, str]:
    """The instruction-set caps on torch's CPU kernels this process runs under ({} for none): a
    measurement made under them stands for a lesser CPU than the flags say, and records so."""
    return {v: os.environ[v] for v in KERNEL_CAP_VARS if os.environ.get(v)}


def describe_caps(caps: dict | None) -> str:
    """', kernels capped by ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2' (sorted) for a machine line, or ''."""
    return ", kernels capped by " + ", ".join(f"{k}={v}" for k, v in sorted(caps.items())) if caps else ""


def describe_cpu(name: str | None, flags: list[str] | None, caps: dict | None) -> str:
    """'NAME (flag, flag)[, kernels capped by ...]' for a machine line: the speed flags as
    cpu_features() lists them ('no AVX2' for none; left out when not recorded) and the caps."""
    return (f"{name or '?'}" + (f" ({', '.join(flags) or 'no AVX2'})" if flags is not None else "")
            + describe_caps(caps))


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo; the platform's word for it elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
        if name:
            return name
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_has_bf16(flags: frozenset | None = None) -> bool:
    """Whether the CPU computes bf16 in hardware (AVX512-BF16 or AMX); others emulate it,
    several times slower than fp32. The flags say what the chip has; oneDNN, which runs
    torch's CPU convolutions and matrix products, must also be allowed to use it: a run
    started with ONEDNN_MAX_CPU_ISA=AVX2 (or any cap below AVX-512) emulates bf16 on any chip.
    `flags` stands in for this CPU's, for tests, and then the cap is not consulted."""
    if flags is not None:
        return bool(flags & BF16_CPU_FLAGS)
    return bool(cpu_flags() & BF16_CPU_FLAGS) and _onednn_bf16()


@functools.cache
def _onednn_bf16() -> bool:
    """Whether torch's oneDNN may run bf16 natively under the instruction-set cap this
    process started with (torch's own check; assumed allowed where torch lacks it)."""
    import torch

    check = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    try:
        return bool(check()) if check is not None else True
    except (RuntimeError, AttributeError):
        return True
