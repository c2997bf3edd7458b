"""What this machine's CPU can do: its name and feature flags, and whether it computes bf16
in hardware (which decides whether bf16-mixed is fast here or emulated and slow)."""
from __future__ import annotations

import functools
import platform

BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


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
    several times slower than fp32. `flags` stands in for this CPU's, for tests."""
    return bool((cpu_flags() if flags is None else flags) & BF16_CPU_FLAGS)
