"""Where a `cifar10-fast` training step's time goes at the convolution level, on this CPU.

Three questions, each answered with the speedrun network's own shapes (widths 64/256/256,
32x32 images, bf16 autocast where the CPU has bf16 hardware, fp32 elsewhere, channels-last,
hasten's host allocator settings):

1. Throughput over batch size: images a second of the whole network's training step (forward,
   backward, an SGD update; vision_systems.bench_steps) at batch 500, 1000 and 2000. On a GPU
   a large batch buys throughput; if a CPU's is flat, a smaller batch (more steps an epoch)
   costs nothing there.
2. Per conv layer: the forward, the input gradient and the weight gradient, each timed alone
   through aten's own kernels (median of `--rounds`), with the rate it reaches in GFLOP/s
   (a multiply-add counted as 2). How far the step is from the rate the forward convs reach.
3. Two other ways to compute the weight gradient, to see whether the slower kernel can be
   beaten from Python: as a forward convolution with the roles of batch and channels swapped,
   and as nine GEMMs over shifted views (one per kernel offset). Each is checked against
   aten's result (relative error of the norm).
4. Which oneDNN kernel runs each pass of each layer (`--kernels`, from oneDNN's verbose log of
   one call each in a fresh process): the implementation's name says whether a pass gets the
   brgemm kernels that the forward convolutions use or an older one.

    python -m benchmarks.probes.speedrun_conv_cost --name speedrun_conv_cost-epyc-bf16
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.tools.common import write_results  # noqa: E402
from vision_systems import bench_steps, label  # noqa: E402

from hasten.allocator import tune_host_allocator  # noqa: E402
from hasten.hardware import cpu_has_bf16  # noqa: E402

# (in channels, out channels, spatial size) of the speedrun network's 3x3 convs at 32x32 input:
# the 2x2 whitening conv makes 31x31, each group pools by 2 after its first conv
LAYERS = [("group 1, conv 1", 24, 64, 31), ("group 1, conv 2", 64, 64, 15), ("group 2, conv 1", 64, 256, 15),
          ("group 2, conv 2", 256, 256, 7), ("group 3, conv 1", 256, 256, 7), ("group 3, conv 2", 256, 256, 3)]


def timed(fn, rounds: int) -> float:
    fn()   # warm-up: oneDNN picks and caches its kernel
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def rel_err(ref: torch.Tensor, other: torch.Tensor) -> float:
    ref, other = ref.float(), other.float()
    return ((ref - other).norm() / ref.norm()).item()


def layer_costs(batch: int, dtype, rounds: int) -> list[dict]:
    rows = []
    cl = torch.channels_last
    for name, cin, cout, hw in LAYERS:
        torch.manual_seed(0)
        w = torch.randn(cout, cin, 3, 3, dtype=dtype).contiguous(memory_format=cl)
        x = torch.randn(batch, cin, hw, hw, dtype=dtype).contiguous(memory_format=cl)
        gy = torch.randn(batch, cout, hw, hw, dtype=dtype).contiguous(memory_format=cl)
        flop = 2 * batch * hw * hw * cin * cout * 9

        def backward(which):
            mask = [which == "input", which == "weight", False]
            return torch.ops.aten.convolution_backward(gy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask)

        def swapped():   # dW[o, c] = sum over n, h, w of x[n, c, shifted] * gy[n, o]: a conv over the batch as channels
            xt = x.transpose(0, 1).contiguous(memory_format=cl)
            gt = gy.transpose(0, 1).contiguous(memory_format=cl)
            return F.conv2d(xt, gt, padding=1).transpose(0, 1)

        def shifted_gemms():
            xp = F.pad(x, (1, 1, 1, 1)).permute(0, 2, 3, 1)
            g = gy.permute(0, 2, 3, 1).reshape(-1, cout)
            out = torch.empty(cout, cin, 3, 3, dtype=dtype)
            for kh in range(3):
                for kw in range(3):
                    out[:, :, kh, kw] = g.t() @ xp[:, kh:kh + hw, kw:kw + hw, :].reshape(-1, cin)
            return out

        t = {"forward": timed(lambda: F.conv2d(x, w, padding=1), rounds),
             "input_grad": timed(lambda: backward("input"), rounds),
             "weight_grad": timed(lambda: backward("weight"), rounds),
             "weight_grad_swapped_conv": timed(swapped, rounds),
             "weight_grad_shifted_gemms": timed(shifted_gemms, rounds)}
        ref = backward("weight")[1]
        rows.append({"layer": name, "in": cin, "out": cout, "size": hw, "gflop": flop / 1e9,
                     "seconds": t, "gflops_per_s": {k: flop / v / 1e9 for k, v in t.items()},
                     "rel_err": {"weight_grad_swapped_conv": rel_err(ref, swapped()),
                                 "weight_grad_shifted_gemms": rel_err(ref, shifted_gemms())}})
        print(f"{name}: forward {t['forward'] * 1e3:.1f} ms, input grad {t['input_grad'] * 1e3:.1f} ms, "
              f"weight grad {t['weight_grad'] * 1e3:.1f} ms", flush=True)
    return rows


PASSES = {"forward_training": "forward", "forward_inference": "forward", "backward_data": "input_grad",
          "backward_weights": "weight_grad"}
SHAPE = re.compile(r"ic(\d+)oc(\d+)_ih(\d+)")


def probe_kernels(batch: int, dtype) -> None:
    """In the probe process: each layer's three passes once under oneDNN's verbose log (to stdout)."""
    cl = torch.channels_last
    calls = []
    for _, cin, cout, hw in LAYERS:
        w = torch.randn(cout, cin, 3, 3, dtype=dtype).contiguous(memory_format=cl)
        x = torch.randn(batch, cin, hw, hw, dtype=dtype).contiguous(memory_format=cl)
        gy = torch.randn(batch, cout, hw, hw, dtype=dtype).contiguous(memory_format=cl)
        calls.append(lambda x=x, w=w: F.conv2d(x, w, padding=1))
        for mask in ([True, False, False], [False, True, False]):
            calls.append(lambda x=x, w=w, gy=gy, mask=mask: torch.ops.aten.convolution_backward(
                gy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask))
    for call in calls:   # warm-up: kernels chosen and cached
        call()
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        for call in calls:
            call()


def layer_kernels(batch: int, dtype) -> dict:
    """{layer name: {pass: oneDNN implementation}} from a fresh process's verbose log."""
    r = subprocess.run([sys.executable, "-m", __spec__.name, "--kernels-probe", "--batch", str(batch),
                        "--dtype", "bf16" if dtype == torch.bfloat16 else "fp32"],
                       capture_output=True, text=True, timeout=1800)
    found = {}
    for line in r.stdout.splitlines():
        f = line.split(",")
        if len(f) < 8 or f[3] != "exec" or f[5] != "convolution" or f[7] not in PASSES:
            continue
        m = SHAPE.search(line)
        if m:
            found[(int(m[1]), int(m[2]), int(m[3]), PASSES[f[7]])] = f[6]
    return {name: {p: found.get((cin, cout, hw, p), "not oneDNN") for p in ("forward", "input_grad", "weight_grad")}
            for name, cin, cout, hw in LAYERS}


def render(data: dict) -> str:
    prec = data["precision"]
    out = [f"# The speedrun network's convolutions on this CPU ({prec}, channels-last, batch {data['batch']})", "",
           "## Throughput of a whole training step over batch size (32x32 images)", "",
           "| batch | images/s |", "|---|---|"]
    out += [f"| {b} | {v:,.0f} |" for b, v in data["throughput"].items()]
    out += ["", "## Per layer: time and rate (GFLOP/s, a multiply-add counted as 2)", "",
            "| layer | shape | forward ms (GFLOP/s) | input grad ms (GFLOP/s) | weight grad ms (GFLOP/s) "
            "| weight grad as swapped conv ms (rel. err) | weight grad as 9 GEMMs ms (rel. err) |",
            "|---|---|---|---|---|---|---|"]
    tot = {k: 0.0 for k in ("forward", "input_grad", "weight_grad")}
    for r in data["layers"]:
        s, g, e = r["seconds"], r["gflops_per_s"], r["rel_err"]
        for k in tot:
            tot[k] += s[k]
        out.append(f"| {r['layer']} | {r['in']}->{r['out']} at {r['size']}x{r['size']} "
                   f"| {s['forward'] * 1e3:.1f} ({g['forward']:.0f}) | {s['input_grad'] * 1e3:.1f} ({g['input_grad']:.0f}) "
                   f"| {s['weight_grad'] * 1e3:.1f} ({g['weight_grad']:.0f}) "
                   f"| {s['weight_grad_swapped_conv'] * 1e3:.1f} ({e['weight_grad_swapped_conv']:.0e}) "
                   f"| {s['weight_grad_shifted_gemms'] * 1e3:.1f} ({e['weight_grad_shifted_gemms']:.0e}) |")
    gflop = sum(r["gflop"] for r in data["layers"])
    out += ["", f"Sums over the six convs: forward {tot['forward'] * 1e3:.0f} ms ({gflop / tot['forward']:.0f} GFLOP/s), "
                f"input gradients {tot['input_grad'] * 1e3:.0f} ms ({gflop / tot['input_grad']:.0f} GFLOP/s), "
                f"weight gradients {tot['weight_grad'] * 1e3:.0f} ms ({gflop / tot['weight_grad']:.0f} GFLOP/s). "
                f"Weight gradients at the forward convs' rate would take {tot['forward'] * 1e3:.0f} ms, "
                f"{(tot['weight_grad'] - tot['forward']) * 1e3:.0f} ms less per step of batch {data['batch']} "
                f"(a whole step: {data['batch'] / data['throughput'][str(data['batch'])] * 1e3:.0f} ms)."]
    if data.get("kernels"):
        out += ["", "## The oneDNN kernel of each pass", "",
                "| layer | forward | input grad | weight grad |", "|---|---|---|---|"]
        out += [f"| {name} | {k['forward']} | {k['input_grad']} | {k['weight_grad']} |"
                for name, k in data["kernels"].items()]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--name", default="speedrun_conv_cost")
    ap.add_argument("--kernels", action="store_true", help="also name the oneDNN kernel of each pass of each layer")
    ap.add_argument("--kernels-probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.kernels_probe:
        tune_host_allocator()
        probe_kernels(args.batch, torch.bfloat16 if args.dtype == "bf16" else torch.float32)
        return 0
    if args.batch < 1 or args.rounds < 1:
        ap.error("--batch and --rounds must be at least 1")
    tune_host_allocator()
    dtype = torch.bfloat16 if cpu_has_bf16() else torch.float32
    batches = sorted({500, 1000, args.batch})
    prec = "bf16" if dtype == torch.bfloat16 else "fp32"
    data = {"batch": args.batch, "rounds": args.rounds, "precision": prec,
            "threads": torch.get_num_threads(),
            # a whole training step (with an SGD update), channels-last, median over rounds
            "throughput": {str(b): bench_steps((64, 256, 256), max(2, args.rounds // 2), [(prec, True, False)],
                                               batch=b, steps=2)[0][label(prec, True, False)] for b in batches},
            "layers": layer_costs(args.batch, dtype, args.rounds)}
    if args.kernels:
        data["kernels"] = layer_kernels(args.batch, dtype)
    j, m = write_results(args.name, data, render(data))
    print(m.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
