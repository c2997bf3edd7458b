"""SpeedMonitor: samples/s, tokens/s and, when FLOPs are known, model FLOP utilisation (MFU).

Throughput is measured over the batches since the last log point, from timestamps the
trainer keeps anyway: no extra synchronisation. FLOPs come from `flops_per_sample`, or
from the model's `flops_per_token` attribute times tokens; MFU needs `peak_flops` (the
device's peak for the precision in use, in FLOP/s).

Where the values show: every logger (console, JSONL, TensorBoard, MLflow, W&B) receives them
under `throughput/...`; a ProgressBar shows samples or tokens per second and the MFU; with
neither a logger nor a progress bar, SpeedMonitor prints one line per log point on standard
error itself (so `Trainer(callbacks=[SpeedMonitor()])` alone is never silent).
"""
from __future__ import annotations

import sys

from ..core import Callback
from .progress import ProgressBar


class SpeedMonitor(Callback):
    def __init__(self, flops_per_sample: float | None = None, peak_flops: float | None = None):
        self.flops_per_sample, self.peak_flops = flops_per_sample, peak_flops
        self._mark = None

    main_rank_only = True

    def fit_start(self, state, logger):
        ts = state.timestamp
        self._mark = (ts.train_seconds, ts.sample, ts.token)
        # nobody else shows the values: print them
        self._print = not getattr(logger, "destinations", None) and not any(
            isinstance(c, ProgressBar) for c in state.callbacks)

    def batch_end(self, state, logger):
        if not state.log_due:
            return
        ts = state.timestamp
        secs, samples, tokens = ts.train_seconds, ts.sample, ts.token
        t0, s0, k0 = self._mark
        dt = secs - t0
        if dt <= 0:
            return
        out = {"throughput/samples_per_sec": (samples - s0) / dt}
        if tokens > k0:
            out["throughput/tokens_per_sec"] = (tokens - k0) / dt
        flops = None
        if self.flops_per_sample is not None:
            flops = self.flops_per_sample * (samples - s0)
        elif getattr(state.model, "flops_per_token", None) and tokens > k0:
            flops = state.model.flops_per_token * (tokens - k0)
        if flops is not None:
            out["throughput/flops_per_sec"] = flops / dt
            if self.peak_flops:
                out["throughput/mfu"] = flops / dt / self.peak_flops
        logger.log(out)
        self._mark = (secs, samples, tokens)
        if self._print:
            print(f"batch {ts.batch}: " + throughput_text(out), file=sys.stderr, flush=True)


def throughput_text(values: dict) -> str:
    """'1,234 samples/s  56,789 tokens/s  MFU 12.3%' from SpeedMonitor's logged values."""
    parts = []
    if "throughput/samples_per_sec" in values:
        parts.append(f"{values['throughput/samples_per_sec']:,.0f} samples/s")
    if "throughput/tokens_per_sec" in values:
        parts.append(f"{values['throughput/tokens_per_sec']:,.0f} tokens/s")
    if "throughput/mfu" in values:
        parts.append(f"MFU {100 * values['throughput/mfu']:.1f}%")
    return "  ".join(parts)
