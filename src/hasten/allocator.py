"""Host memory allocator settings for CPU training (glibc malloc).

By default glibc's malloc adapts two thresholds as a program runs: blocks above the *mmap
threshold* are mapped fresh from the kernel and unmapped on free, and free memory above the
*trim threshold* at the top of the heap is handed back to the kernel. A CPU training step
allocates and frees activation buffers of tens of MiB every step; when their sizes change
(a pruned epoch ends on a batch of a new size, progressive resizing, a new sequence length)
the thresholds move and buffers go back to the kernel, to be faulted in again page by page
on the next step. On hasten's 2-core benchmark machine this made InfoBatch's cost per
sample grow by 16% over a run (see docs/methods/infobatch.md); with the settings below it
stayed flat.

`tune_host_allocator()` fixes four settings with `mallopt`, for the whole process and
its future DataLoader workers: mmap threshold 32 MiB (the largest glibc accepts on 64-bit),
trim threshold 2 GiB (the largest a C int holds), top pad 256 MiB, and no mmapped blocks at
all (mmap max 0). Fixing them also switches off glibc's own adaptation. The last one matters
for activations above 32 MiB (a batch of 1024 CIFAR images at 64 channels and 32x32 in bf16
is 128 MiB): glibc maps every block above the threshold fresh from the kernel and unmaps it on
free, so each step faults such buffers in again page by page (a new 116 MiB buffer took 26 ms
to zero here, a reused one 7 ms); from the heap they are reused. With the four settings the
speedrun network's bf16 training step ran about 5% faster than with the first three alone
(1,160 -> 1,230 images/s on hasten's 2-core AMX benchmark machine). The price: up to the trim threshold of freed memory stays with the process instead of going
back to the system, which a training process, holding its peak working set anyway, rarely
notices. The same settings can be given in the environment before Python starts
(`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_`, `MALLOC_MMAP_MAX_`); when
any of those is set, hasten leaves the allocator alone and says so.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
from dataclasses import dataclass

# mallopt parameter numbers from glibc's <malloc.h>.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -2, -3, -4

MMAP_THRESHOLD = 32 * 2**20     # glibc's HEAP_MAX/2 cap on 64-bit: larger values are refused
TRIM_THRESHOLD = 2**31 - 1      # mallopt takes a C int
TOP_PAD = 256 * 2**20
MMAP_MAX = 0                    # no block is mmapped: those above the threshold come from the heap too

ENV_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
MODES = ("auto", "tuned", "default")

_report: "AllocatorReport | None" = None   # the first call's outcome, whatever it was


@dataclass(frozen=True)
class AllocatorReport:
    applied: bool
    reason: str

    def __str__(self) -> str:
        return self.reason


@functools.cache
def _libc():
    if platform.system() != "Linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    # musl and other C libraries have no mallopt, or one that ignores these parameters
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return None
    return libc


def tune_host_allocator(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD,
                        top_pad: int = TOP_PAD, mmap_max: int = MMAP_MAX) -> AllocatorReport:
    """Fix glibc malloc's mmap threshold, trim threshold, top pad and mmap max for this process.

    Idempotent: later calls return the first call's report. A no-op, with the reason in the
    report, on a system without glibc or when the user set the MALLOC_*_ variables.
    """
    global _report
    for name, value in (("mmap_threshold", mmap_threshold), ("trim_threshold", trim_threshold), ("top_pad", top_pad),
                        ("mmap_max", mmap_max)):
        if not 0 <= int(value) < 2**31:
            raise ValueError(f"{name}={value}: mallopt takes a C int, use 0 <= value < 2**31")
    if _report is None:
        _report = _tune(mmap_threshold, trim_threshold, top_pad, mmap_max)
    return _report


def _tune(mmap_threshold: int, trim_threshold: int, top_pad: int, mmap_max: int) -> AllocatorReport:
    user = [v for v in ENV_VARS if v in os.environ]
    if user:
        return AllocatorReport(False, f"host allocator: left as set in the environment ({', '.join(user)})")
    libc = _libc()
    if libc is None:
        return AllocatorReport(False, "host allocator: not glibc, left as is")
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    ok = all(libc.mallopt(param, int(value)) == 1 for param, value in (
        (M_MMAP_THRESHOLD, mmap_threshold), (M_TRIM_THRESHOLD, trim_threshold), (M_TOP_PAD, top_pad),
        (M_MMAP_MAX, mmap_max)))
    if not ok:
        return AllocatorReport(False, "host allocator: glibc refused the settings, left as is")
    return AllocatorReport(True, f"host allocator: glibc malloc tuned (mmap threshold "
                                 f"{mmap_threshold >> 20} MiB, trim threshold {trim_threshold >> 20} MiB, "
                                 f"top pad {top_pad >> 20} MiB, mmap max {mmap_max})")


def host_allocator_state() -> str:
    """One line for run records, observed in this process: what hasten set, else what the
    environment set before the process started (the MALLOC_*_ variables glibc reads), else the
    C library's defaults."""
    if _report is not None:
        return _report.reason
    user = {v: os.environ[v] for v in ENV_VARS if v in os.environ}
    if user:
        return ("host allocator: set in the environment, not by hasten ("
                + ", ".join(f"{k}={v}" for k, v in user.items()) + ")")
    return "host allocator: left as is" + ("" if _libc() is None else " (glibc defaults)")


def configure_host_allocator(mode: str, device_type: str) -> AllocatorReport | None:
    """The Trainer's `host_allocator` option: 'auto' tunes for CPU training, 'tuned' always,
    'default' never."""
    if mode not in MODES:
        raise ValueError(f"host_allocator={mode!r}: use one of {MODES}")
    if mode == "default" or (mode == "auto" and device_type != "cpu"):
        return None
    return tune_host_allocator()
