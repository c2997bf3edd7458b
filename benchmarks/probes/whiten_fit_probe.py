"""What patch whitening's fit costs in a fresh process, with and without the device prepared.

`cifar10-fast` fits its whitening conv at INIT, inside timed work. In a fresh process on a GPU
that fit is often the first matrix product, so it pays the device's one-off library set-up
(the cuBLAS handle and workspace); a compared script that runs an untimed warm-up first does
not. `hasten.runtime.prepare_device` (called by `make_runtime`) pays that set-up before any
clock. This measures the fit's parts (sample normalised, patch covariance, the d x d
eigendecomposition, filters written) three times in one fresh process, with the device left
cold or prepared first, each mode in its own process, alternating for `--rounds` rounds.
5,000 random 32 px images at the recipe's eps; the data's values do not change the work.

    python -m benchmarks.probes.whiten_fit_probe [--device cuda] [--rounds 2] [--name whiten_fit_probe]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

PARTS = ("sample", "covariance", "eigh", "filters", "total")


def one_process(device: str, prepared: bool) -> list[dict]:
    from hasten.algorithms.patch_whitening import covariance_eigh, patch_covariance, whitening_filters
    from hasten.runtime import prepare_device
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (5000, 3, 32, 32), dtype=torch.uint8, generator=gen).to(dev)
    mean = torch.tensor([125.0, 123.0, 114.0], device=dev).view(1, 3, 1, 1)
    std = torch.tensor([63.0, 62.0, 66.0], device=dev).view(1, 3, 1, 1)
    sync()
    t_prep = 0.0
    if prepared:
        t0 = time.perf_counter()
        prepare_device(dev)
        t_prep = time.perf_counter() - t0
    conv = torch.nn.Conv2d(3, 24, 2, device=dev)
    sync()
    out = []
    for _ in range(3):
        times, t0 = {}, time.perf_counter()
        t = t0
        with torch.no_grad():
            images = (raw.float() - mean) / std
            sync(); now = time.perf_counter(); times["sample"] = now - t; t = now                  # noqa: E702
            m, cov = patch_covariance(images, 2)
            sync(); now = time.perf_counter(); times["covariance"] = now - t; t = now              # noqa: E702
            evals, evecs = covariance_eigh(cov)
            now = time.perf_counter(); times["eigh"] = now - t; t = now                            # noqa: E702
            filters, bias = whitening_filters(m, evals, evecs, 5e-4)
            conv.weight.copy_(filters.view_as(conv.weight))   # as fit_patch_whitening writes them
            conv.bias.copy_(bias)
            sync(); now = time.perf_counter(); times["filters"] = now - t                          # noqa: E702
        times["total"] = now - t0
        out.append({"prepare_s": t_prep, **times})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cuda where there is one, else cpu")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--name", default="whiten_fit_probe")
    ap.add_argument("--child", choices=("cold", "prepared"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: this machine has no CUDA device; use --device cpu")
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    if a.child:
        print(json.dumps(one_process(a.device, a.child == "prepared")))
        return
    from benchmarks.tools.common import write_results
    runs = {"cold": [], "prepared": []}
    for r in range(a.rounds):
        for mode in runs:
            got = subprocess.run([sys.executable, "-m", __spec__.name, "--device", a.device, "--child", mode],
                                 capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(got.stdout.strip().splitlines()[-1]))
            print(mode, "round", r, [round(f["total"] * 1e3, 1) for f in runs[mode][-1]], "ms", flush=True)
    rows = ["| device state | fit in the process | " + " | ".join(f"{p} ms" for p in PARTS) + " | prepare_device ms |",
            "|---|---|" + "---|" * (len(PARTS) + 1)]
    for mode, procs in runs.items():
        for i, which in enumerate(("first", "second", "third")):
            med = {p: statistics.median(proc[i][p] for proc in procs) * 1e3 for p in PARTS + ("prepare_s",)}
            prep = f"{med['prepare_s']:.1f}" if i == 0 and mode == "prepared" else "–"
            rows.append(f"| {mode} | {which} | " + " | ".join(f"{med[p]:.1f}" for p in PARTS) + f" | {prep} |")
    dev = torch.cuda.get_device_name() if a.device.startswith("cuda") and torch.cuda.is_available() else a.device
    md = (f"# Patch whitening's fit in a fresh process ({dev})\n\n"
          f"Medians over {a.rounds} fresh process(es) per mode, modes alternating; each process fits three "
          "times. cold: the fit is the process's first matrix product; prepared: "
          "`hasten.runtime.prepare_device` ran first (its own time in the last column).\n\n" + "\n".join(rows))
    write_results(a.name, {"device": dev, "rounds": a.rounds, "runs": runs}, md)
    print(md)


if __name__ == "__main__":
    main()
