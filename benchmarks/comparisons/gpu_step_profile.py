"""Where a training step's time goes: hasten's `cifar10-fast` step against the Muon peer's.

On an H200 a compiled `cifar10-fast` step cost 10-20% more than the compiled airbench94_muon
step, and compiling did not shorten it (docs/vision.md, "Against airbench94_muon on a GPU").
This profiles both steps on the same device with torch.profiler, each in steady state (after
`--wait` steps, which cover compilation), over `--active` steps:

- host ms a step: the profiler's step spans on the host (with a GPU, a step the host queues
  faster than the device runs is held back by the device, so this is the step's wall time);
- device busy ms a step and kernels a step (GPU only): the kernels' summed time and count;
- the operators with the most host time, and (GPU) the kernels with the most device time.

A step whose device busy time is well below its host time waits on the host: Python, the
dispatcher, launches. Both sides at 32 px throughout (hasten's progressive resizing off), the
recipe's batch; hasten through `hasten.build.build_run`, its whole Trainer loop; the peer
through its own `run`, the step ending at its Muon update.

    python -m benchmarks.comparisons.gpu_step_profile --data cifar10-jpeg.zip [--device cuda] [--compile]
        [--compile-mode reduce-overhead] [--batch-size 2000] [--wait 30] [--active 20] [--name gpu_step_profile]

(Runs on the CPU too, slowly: `--device cpu --batch-size 100 --wait 3 --active 4`.)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule


WARM = 3   # profiler warm-up steps between the waiting steps and the recorded ones


def _is_device(e) -> bool:
    dt = getattr(e, "device_type", None)
    return dt is not None and "CUDA" in str(dt)


def _is_annotation(e) -> bool:
    """A range the profiler or torch marks on the device timeline (a step, an optimizer's step), not a kernel."""
    return bool(getattr(e, "is_user_annotation", False)) or e.name.startswith(("ProfilerStep", "Optimizer."))


def summarise(prof, active: int) -> dict:
    # On a GPU each step (and each optimizer step) is also marked on the device timeline, under
    # the same name: the host spans are the CPU-side marks only, and kernels leave the marks out
    # (counting both halved every per-step figure on one side and not the other: the H200 record
    # gpu_step_profile-compile-h200-3 was made that way, its reading corrected in its .md)
    events = prof.events()
    steps = [e for e in events if e.name.startswith("ProfilerStep") and not _is_device(e)]
    host = [e.time_range.elapsed_us() / 1e3 for e in steps]
    kernels = [e for e in events if _is_device(e) and not _is_annotation(e)]
    ops: dict[str, float] = {}
    for e in events:
        if not _is_device(e) and not e.name.startswith("ProfilerStep"):
            ops[e.name] = ops.get(e.name, 0.0) + e.self_cpu_time_total / 1e3
    by_kernel: dict[str, float] = {}
    for e in kernels:
        by_kernel[e.name] = by_kernel.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3
    n = max(1, len(steps) or active)
    return {"steps": len(steps), "host_ms_per_step": statistics.median(host) if host else None,
            "host_ms_per_step_all": host,
            "device_busy_ms_per_step": sum(by_kernel.values()) / n if kernels else None,
            "kernels_per_step": len(kernels) / n if kernels else None,
            "top_host_ops_ms_per_step": {k: v / n for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:15]},
            "top_kernels_ms_per_step": {k[:90]: v / n for k, v in sorted(by_kernel.items(), key=lambda kv: -kv[1])[:10]}}


def _profiler(device: torch.device, wait: int, active: int):
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=acts, schedule=schedule(wait=wait, warmup=WARM, active=active, repeat=1))


def profile_peer(data, device: torch.device, compiled: bool, batch: int, wait: int, active: int) -> dict:
    from benchmarks.comparisons.peers import airbench94_muon as peer
    peer.RUN.update(device=device, compile=compiled, amp=device.type == "cuda" or peer.cpu_has_bf16())
    peer.HYP["batch_size"] = batch
    total = wait + WARM + active
    peer.run(data, seed=10_000, epoch_evals=False, warmup_steps=total)   # compiles, untimed
    prof = _profiler(device, wait, active)
    original = peer.KernelMuon.step

    def step_then_mark(self):
        out = original(self)
        prof.step()
        return out

    peer.KernelMuon.step = step_then_mark
    try:
        with prof:
            peer.run(data, seed=10_001, epoch_evals=False, warmup_steps=total + 1)
    finally:
        peer.KernelMuon.step = original
    return summarise(prof, active)


def profile_hasten(data_path: str, device: torch.device, compiled: bool, batch: int, wait: int, active: int,
                   mode: str | None = None) -> dict:
    from hasten.build import build_run
    from hasten.config import load_recipe
    from hasten.core.callback import Callback
    total = wait + WARM + active
    with tempfile.TemporaryDirectory() as tmp:
        recipe = load_recipe("cifar10-fast", [
            f"data.path={data_path}", f"data.batch_size={batch}", f"trainer.device={device.type}",
            f"trainer.compile={str(compiled).lower()}", "algorithms.progressive_resizing=null",
            "algorithms.selective_backprop=null",   # the plain step, as the peer takes it
            *([f"trainer.compile_mode={mode}"] if mode else []),
            "trainer.eval_interval=1000ep", "trainer.max_duration=1000ep", f"trainer.run_dir={tmp}/run",
            "trainer.checkpoints=false"])
        run = build_run(recipe, progress_bar=False, console_logger=False)
        prof = _profiler(device, wait, active)

        class Mark(Callback):
            def __init__(self):
                self.n = 0

            def batch_end(self, state, logger):
                prof.step()
                self.n += 1
                if self.n > total:
                    state.stop_training = True

        run.trainer.add_callbacks(Mark())
        run.trainer.eval_dataloader = None   # no final evaluation: only steps are profiled
        try:
            with prof:
                run.trainer.fit(summary=False)
        finally:
            run.close()
    return summarise(prof, active)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="the CIFAR-10 archive, folder or zip")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--compile", action="store_true", help="both sides compiled (as the GPU comparison runs them)")
    ap.add_argument("--compile-mode", default=None, help="hasten's side only: torch.compile's mode, e.g. "
                    "reduce-overhead (CUDA graphs; with --compile)")
    ap.add_argument("--batch-size", type=int, default=2000)
    ap.add_argument("--wait", type=int, default=30, help="steps before recording (compilation falls in them)")
    ap.add_argument("--active", type=int, default=20, help="steps recorded")
    ap.add_argument("--name", default="gpu_step_profile")
    a = ap.parse_args()
    if a.compile_mode and not a.compile:
        sys.exit("gpu_step_profile: --compile-mode needs --compile")
    if min(a.batch_size, a.wait, a.active) < 1:
        sys.exit("gpu_step_profile: --batch-size, --wait and --active must be at least 1")
    try:
        device = torch.device(a.device)
    except RuntimeError:
        sys.exit(f"gpu_step_profile: unknown device {a.device!r}: use cpu or cuda")
    from hasten.data.cifar import load_cifar10
    from benchmarks.tools.common import write_results
    data = load_cifar10(a.data)
    label = "hasten cifar10-fast (32 px" + (f", {a.compile_mode})" if a.compile_mode else ")")
    sides = {label: profile_hasten(a.data, device, a.compile, a.batch_size, a.wait, a.active, a.compile_mode),
             "airbench94_muon (hasten's rendering)": profile_peer(data, device, a.compile, a.batch_size, a.wait, a.active)}
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"

    def f(v, fmt="{:.2f}"):
        return "–" if v is None else fmt.format(v)

    how = (", compiled" if a.compile else "") + (f"; hasten's side in mode {a.compile_mode}" if a.compile_mode else "")
    lines = [f"# One training step, hasten against the Muon peer ({dev}{how})", "",
             f"Batch {a.batch_size}, 32 px, steady state: {a.active} steps recorded after {a.wait + WARM}.", "",
             "| side | host ms a step (median) | device busy ms a step | kernels a step |", "|---|---|---|---|"]
    for side, r in sides.items():
        lines.append(f"| {side} | {f(r['host_ms_per_step'])} | {f(r['device_busy_ms_per_step'])} | "
                     f"{f(r['kernels_per_step'], '{:.0f}')} |")
    for side, r in sides.items():
        lines += ["", f"## {side}: host time by operator (self, ms a step)", "", "| operator | ms |", "|---|---|"]
        lines += [f"| `{k}` | {v:.3f} |" for k, v in r["top_host_ops_ms_per_step"].items()]
        if r["top_kernels_ms_per_step"]:
            lines += ["", f"## {side}: device time by kernel (ms a step)", "", "| kernel | ms |", "|---|---|"]
            lines += [f"| `{k}` | {v:.3f} |" for k, v in r["top_kernels_ms_per_step"].items()]
    md = "\n".join(lines)
    write_results(a.name, {"device": dev, "compiled": a.compile, "compile_mode": a.compile_mode,
                           "batch_size": a.batch_size, "wait": a.wait,
                           "active": a.active, "sides": sides}, md)
    print(md)


if __name__ == "__main__":
    main()
