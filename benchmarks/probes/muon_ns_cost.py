"""Cost of Muon's Newton-Schulz iteration per optimizer step, in bf16 and in fp32.

torch.optim.Muon always orthogonalises in bf16; CPUs without AVX512-BF16 or AMX emulate
bf16 matrix products. For each model, one `ConvMuon` per precision steps the model's Muon
parameters (random gradients; the model's own shapes and iteration count), the two
interleaved round by round; the table gives median seconds per step, their ratio, and how
far the bf16 iteration's output lies from the fp32 one (relative Frobenius norm over all the
model's Muon matrices, for the random gradients).

    python -m benchmarks.probes.muon_ns_cost [--rounds 5] [--steps 3] [--name muon_ns_cost]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.tools.common import write_results
from hasten.models import GPT, GPTConfig, SpeedrunNet
from hasten.optim import ConvMuon, newton_schulz, split_for_muon
from hasten.hardware import cpu_has_bf16

MODELS = {  # name: (model, Newton-Schulz steps, normalize) as the recipes use them
    "speedrun net (cifar10-fast)": (lambda: SpeedrunNet(widths=(64, 256, 256)), 3, True),
    "char GPT 4x128 (shakespeare-char)": (lambda: GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128)), 5, False),
}


def make(build, ns_steps, normalize, dtype):
    torch.manual_seed(0)
    params = [p for _, p in split_for_muon(build())[0]]
    for p in params:
        p.grad = torch.randn_like(p)
    return params, ConvMuon(params, lr=0.02, momentum=0.6, ns_steps=ns_steps, normalize_weights=normalize,
                            ns_dtype=dtype)


def seconds_per_step(opt, steps):
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - t0) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per precision per round")
    ap.add_argument("--name", default="muon_ns_cost", help="results file name (one per machine you keep)")
    args = ap.parse_args()
    bf16_hw = cpu_has_bf16()
    results, lines = {"bf16_hardware": bf16_hw, "models": {}}, [
        "# Muon's Newton-Schulz iteration: bf16 against fp32", "",
        f"Seconds per optimizer step over the model's Muon parameters, median of {args.rounds} interleaved "
        f"rounds of {args.steps} steps; CPU bf16 hardware (AVX512-BF16 or AMX): {'yes' if bf16_hw else 'no'}.", "",
        "| model | Muon parameters | NS steps | bf16 s/step | fp32 s/step | bf16 / fp32 | update difference |",
        "|---|---:|---:|---:|---:|---:|---:|"]
    for name, (build, ns_steps, normalize) in MODELS.items():
        setups = {d: make(build, ns_steps, normalize, d) for d in ("bf16", "fp32")}
        mats = [p.grad.reshape(p.shape[0], -1) for p in setups["fp32"][0]]
        outs = {d: torch.cat([newton_schulz(g, steps=ns_steps, dtype=dt).float().flatten() for g in mats])
                for d, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32))}
        diff = ((outs["bf16"] - outs["fp32"]).norm() / outs["fp32"].norm()).item()
        for _, opt in setups.values():   # warm-up
            opt.step()
        times = {d: [] for d in setups}
        for _ in range(args.rounds):
            for d, (_, opt) in setups.items():
                times[d].append(seconds_per_step(opt, args.steps))
        med = {d: statistics.median(v) for d, v in times.items()}
        n = sum(p.numel() for p in setups["fp32"][0])
        results["models"][name] = {"muon_params": n, "ns_steps": ns_steps, "seconds_per_step": med,
                                   "bf16_over_fp32": med["bf16"] / med["fp32"], "update_rel_diff": diff}
        lines.append(f"| {name} | {n:,} | {ns_steps} | {med['bf16']:.4f} | {med['fp32']:.4f} | "
                     f"{med['bf16'] / med['fp32']:.1f}x | {diff:.2%} |")
    j, m = write_results(args.name, results, "\n".join(lines))
    print(m.read_text())


if __name__ == "__main__":
    main()
