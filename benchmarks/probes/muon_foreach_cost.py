"""Cost of a ConvMuon step with `foreach` on and off, on the CIFAR speedrun net's kernels.

`foreach=True` updates the momenta with multi-tensor kernels and runs Newton-Schulz once per set
of same-shape kernels, stacked; `foreach=False` steps the kernels one at a time. torch.optim's
rule, which ConvMuon follows by default, takes the first on CUDA and the second elsewhere. The
speedrun net at the `cifar10-fast` widths (its six Muon kernels, channels-last), the recipe's
settings (3 Newton-Schulz steps, normalised kernels, momentum 0.6), random gradients; the two
optimizers step alternately, `--steps` steps a round, under hasten's host allocator settings
(on the CPU, as `hasten train` runs); the table gives the median milliseconds a step.

    python -m benchmarks.probes.muon_foreach_cost [--device cpu] [--rounds 20] [--steps 10] [--ns-dtype bf16]
                                            [--name muon_foreach_cost]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.tools.common import write_results
from hasten.allocator import tune_host_allocator
from hasten.models import SpeedrunNet
from hasten.optim import ConvMuon


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--ns-dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--name", default="muon_foreach_cost")
    a = ap.parse_args()
    if a.rounds < 1 or a.steps < 1:
        raise SystemExit("muon_foreach_cost: --rounds and --steps must be at least 1")
    dev = torch.device(a.device)
    if dev.type == "cpu":
        tune_host_allocator()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    net = SpeedrunNet(widths=[64, 256, 256]).to(dev, memory_format=torch.channels_last)
    kernels = [p for n, p in net.named_parameters() if p.ndim == 4 and "whiten" not in n]

    def optimizer(foreach: bool) -> ConvMuon:
        ps = [torch.nn.Parameter(k.detach().clone()) for k in kernels]
        opt = ConvMuon(ps, lr=0.24, momentum=0.6, weight_decay=1e-4, ns_steps=3, normalize_weights=True,
                       ns_dtype=a.ns_dtype, foreach=foreach)
        for p in ps:
            p.grad = torch.randn_like(p)
        return opt

    opts = {"one at a time (foreach=False)": optimizer(False), "foreach=True": optimizer(True)}
    times: dict[str, list[float]] = {k: [] for k in opts}
    for r in range(a.rounds + 1):   # round 0: warm-up, not kept
        for name, opt in (opts.items() if r % 2 else reversed(opts.items())):
            sync()
            t = time.perf_counter()
            for _ in range(a.steps):
                opt.step()
            sync()
            if r:
                times[name].append((time.perf_counter() - t) / a.steps * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    shapes = ", ".join("x".join(map(str, k.shape)) for k in kernels)
    rows = [f"| {k} | {v:.2f} | {min(times[k]):.2f} |" for k, v in med.items()]
    md = (f"# ConvMuon step, foreach off and on ({a.device}, Newton-Schulz in {a.ns_dtype})\n\n"
          f"The speedrun net's Muon kernels ({shapes}); {a.rounds} rounds of {a.steps} steps, alternating.\n\n"
          "| form | median ms a step | best ms a step |\n|---|---|---|\n" + "\n".join(rows))
    write_results(a.name, {"device": a.device, "ns_dtype": a.ns_dtype, "rounds": a.rounds, "steps": a.steps,
                           "ms_per_step": times}, md)
    print(md)


if __name__ == "__main__":
    main()
