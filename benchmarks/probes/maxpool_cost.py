"""What the speedrun net's 2x2 max-pools cost on CPU, and whether a cheaper exact pool exists.

PyTorch's CPU max-pool saves an int64 index per output element (four times the bytes of a
bf16 output) and its backward pass zero-fills the whole input gradient before scattering into
it. Two candidates that give PyTorch's numbers bit for bit (ties and cropped odd edges
included, checked here before timing):
- "index-free": the output as the elementwise maximum of the four strided 2x2 views, the
  output saved instead of indices, and a backward pass that writes each view's share of the
  gradient (the first position of each window, row-major, that equals the maximum) straight
  into the input gradient, in eager ops;
- "compiled": `torch.compile` of `F.max_pool2d` (inductor's own pool and its backward).

Measured at the pools' shapes in the `cifar10-fast` net at 32 px (the conv outputs 31, 15 and
7 pixels wide; batch 2000, channels-last), the pool alone forward and backward, candidates
interleaved round by round (the table gives the median); then whole training steps of the net
(forward, backward; batch 2000 and 1000 at 32 px, 2000 at 24 px) with PyTorch's pool and with
the index-free one.

    python -m benchmarks.probes.maxpool_cost [--rounds 5] [--precision bf16|fp32] [--name maxpool_cost]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.tools.common import write_results
from hasten.allocator import tune_host_allocator
from hasten.models import SpeedrunNet


def _views(x, k=2):
    h, w = x.shape[-2] // k * k, x.shape[-1] // k * k
    return [x[..., i:h:k, j:w:k] for i in range(k) for j in range(k)]


class IndexFreePool(torch.autograd.Function):
    """2x2 max-pool, stride 2: PyTorch's outputs and gradients without saving indices."""

    @staticmethod
    def forward(ctx, x):
        a, b, c, d = _views(x)
        y = torch.maximum(torch.maximum(a, b), torch.maximum(c, d))
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        gx = torch.empty_like(x)
        H, W = x.shape[-2:]
        h, w = H // 2 * 2, W // 2 * 2
        if h < H:
            gx[..., h:, :].zero_()
        if w < W:
            gx[..., :h, w:].zero_()
        xs, gs = _views(x), _views(gx)
        taken = xs[0] == y
        torch.mul(g, taken, out=gs[0])
        for xv, gv in zip(xs[1:3], gs[1:3]):
            hit = (xv == y) & ~taken
            torch.mul(g, hit, out=gv)
            taken |= hit
        torch.mul(g, ~taken, out=gs[3])     # the last position takes what no earlier one did
        return gx


class IndexFree(nn.Module):
    def forward(self, x):
        return IndexFreePool.apply(x)


def same_as_pytorch(dtype) -> bool:
    g = torch.Generator().manual_seed(0)
    ok = True
    for shape in ((3, 5, 8, 6), (2, 7, 31, 31), (2, 4, 7, 7)):
        x = torch.randint(-2, 3, shape, generator=g).to(dtype).contiguous(memory_format=torch.channels_last)
        ref, new = x.clone().requires_grad_(), x.clone().requires_grad_()
        y_ref, y = F.max_pool2d(ref, 2), IndexFreePool.apply(new)
        gy = torch.randn(y.shape, generator=g).to(dtype)
        y_ref.backward(gy)
        y.backward(gy)
        ok &= torch.equal(y, y_ref) and torch.equal(new.grad, ref.grad)
    return ok


def timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    ap.add_argument("--name", default="maxpool_cost", help="results file name (one per machine you keep)")
    args = ap.parse_args()
    tune_host_allocator()   # what the Trainer does on the CPU
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    exact = same_as_pytorch(dtype)
    compiled = torch.compile(lambda x: F.max_pool2d(x, 2), dynamic=False)
    pools = {"pytorch": lambda x: F.max_pool2d(x, 2), "index-free": IndexFreePool.apply, "compiled": compiled}
    shapes = [(2000, 64, 31, 31), (2000, 256, 15, 15), (2000, 256, 7, 7)]
    pool_t = {(s, k, p): [] for s in shapes for k in pools for p in ("fwd", "bwd")}
    xs = {s: torch.randn(s).to(dtype).contiguous(memory_format=torch.channels_last).requires_grad_() for s in shapes}
    for r in range(args.rounds + 1):       # round 0 warms up (compilation, first allocations)
        for s in shapes:
            for k in (list(pools) if r % 2 == 0 else list(pools)[::-1]):
                out = {}
                tf = timed(lambda: out.setdefault("y", pools[k](xs[s])))
                gy = torch.ones_like(out["y"])
                tb = timed(lambda: torch.autograd.grad(out["y"], xs[s], gy))
                if r:
                    pool_t[s, k, "fwd"].append(tf)
                    pool_t[s, k, "bwd"].append(tb)

    torch.manual_seed(0)
    nets = {"pytorch": SpeedrunNet(widths=(64, 256, 256), logit_scale=1 / 256).to(memory_format=torch.channels_last)}
    nets["index-free"] = copy.deepcopy(nets["pytorch"])
    for group in nets["index-free"].groups:
        group[1] = IndexFree()
    for net in nets.values():
        net.whiten.requires_grad_(False)   # frozen filters and a stopped bias, as after patch_whitening's epochs
    cases = [(2000, 32), (1000, 32), (2000, 24)]
    step_t = {(c, k): [] for c in cases for k in nets}

    def step(net, x, y):
        with torch.autocast("cpu", torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = F.cross_entropy(net(x), y, label_smoothing=0.2)
        loss.backward()
        net.zero_grad(set_to_none=True)

    for c in cases:
        x = torch.randn(c[0], 3, c[1], c[1]).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (c[0],))
        for r in range(args.rounds + 1):
            for k in (list(nets) if r % 2 == 0 else list(nets)[::-1]):
                t = timed(lambda: step(nets[k], x, y))
                if r:
                    step_t[c, k].append(t)

    med = {key: statistics.median(v) for key, v in {**pool_t, **step_t}.items()}
    lines = ["# The speedrun net's max-pools on CPU", "",
             f"{args.precision}, channels-last, median over {args.rounds} interleaved rounds after one of warm-up. "
             f"Index-free pool equal to PyTorch's bit for bit (outputs and gradients, ties included): {exact}.", "",
             "| pool input | PyTorch fwd ms | bwd ms | index-free fwd ms | bwd ms | compiled fwd ms | bwd ms |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for s in shapes:
        cells = " | ".join(f"{1e3 * med[s, k, p]:.1f}" for k in pools for p in ("fwd", "bwd"))
        lines.append(f"| {'x'.join(map(str, s))} | {cells} |")
    lines += ["", "Whole training steps of the net (forward and backward, the whitening frozen):", "",
              "| batch | px | PyTorch's pool s | index-free s | ratio |", "|---:|---:|---:|---:|---:|"]
    for c in cases:
        a, b = med[c, "pytorch"], med[c, "index-free"]
        lines.append(f"| {c[0]} | {c[1]} | {a:.3f} | {b:.3f} | {b / a:.3f} |")
    j, m = write_results(args.name, {
        "precision": args.precision, "rounds": args.rounds, "exact": exact,
        "pool_ms": {f"{'x'.join(map(str, s))} {k} {p}": [1e3 * t for t in pool_t[s, k, p]]
                    for s in shapes for k in pools for p in ("fwd", "bwd")},
        "step_s": {f"batch {c[0]} {c[1]}px {k}": step_t[c, k] for c in cases for k in nets}},
        "\n".join(lines))
    print(m.read_text())


if __name__ == "__main__":
    main()
