"""SpeedMonitor: samples/s, tokens/s and, when FLOPs are known, model FLOP utilisation (MFU).

Throughput is measured over the batches since the last log point, from timestamps the
trainer keeps anyway: no extra synchronisation. FLOPs come from `flops_per_sample`, or
from the model's `flops_per_token` attribute times tokens; MFU needs `peak_flops` (the
device's peak for the precision in use, in FLOP/s).
"""
from __future__ import annotations

from ..core import Callback


class SpeedMonitor(Callback):
    def __init__(self, flops_per_sample: float | None = None, peak_flops: float | None = None):
        self.flops_per_sample, self.peak_flops = flops_per_sample, peak_flops
        self._mark = None

    def fit_start(self, state, logger):
        ts = state.timestamp
        self._mark = (ts.train_seconds, ts.sample, ts.token)

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
