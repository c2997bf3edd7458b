"""When does float8 pay? A GPT trained in bf16 against the same GPT with its large Linear
layers in float8 (torchao, through hasten's `convert_to_float8`), same weights at the start,
same batches, same steps, one process.

For each size (layers x width, heads of 64) and each variant (bf16; float8 with tensorwise
or rowwise scaling) the model is built from one seed, converted, compiled block by block
(each transformer block is compiled once and the compiled code serves every block), trained
`--warmup` untimed steps and then `--steps` timed ones (CUDA events on a GPU). Reported:
tokens per second, the ratio to bf16 of the same size, peak memory, which layers were
converted (hasten's rule: features multiples of 16 and at least `--min-elements` weights, the
head left out), and the training loss over the same steps (the mean of the last 20 and the
largest step-by-step difference to bf16's curve).

Data: Tiny Shakespeare as bytes (vocabulary 256, the copy packaged with hasten), contexts
drawn by one generator, so every variant sees the same batches.

    python -m benchmarks.comparisons.float8_gpt --device cuda --sizes 12x768,24x1024 --name float8-gpt-h100

On a CPU (no float8 units; torchao's products are emulated) it runs as a smoke test:

    python -m benchmarks.comparisons.float8_gpt --device cpu --sizes 2x256 --block 128 --batch 4 --steps 4 --warmup 1 --no-compile
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.tools.common import write_results  # noqa: E402

from hasten.algorithms.float8_training import convert_to_float8  # noqa: E402
from hasten.models.gpt import GPT, GPTConfig  # noqa: E402

TEXT = Path(__file__).resolve().parents[2] / "src" / "hasten" / "data" / "tinyshakespeare.txt"


def parse_size(s: str) -> tuple[int, int]:
    try:
        layers, width = (int(v) for v in s.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--sizes: {s!r} is not LAYERSxWIDTH (e.g. 12x768)")
    if width % 64:
        raise SystemExit(f"--sizes: width {width} must be a multiple of 64 (heads of 64)")
    return layers, width


def batches(data: torch.Tensor, n: int, batch: int, block: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        ix = torch.randint(len(data) - block - 1, (batch,), generator=g)
        x = torch.stack([data[i:i + block] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block] for i in ix])
        yield x, y


def run(size: tuple[int, int], variant: str, args, data: torch.Tensor, device: torch.device) -> dict:
    layers, width = size
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, block_size=args.block, n_layer=layers, n_head=width // 64, n_embd=width)
    model = GPT(cfg).to(device)
    params = sum(p.numel() for p in model.parameters())
    converted = [] if variant == "bf16" else convert_to_float8(model, args.min_elements, recipe=variant)
    if args.compile:
        torch._dynamo.reset()
        for block in model.blocks:
            block.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    losses, compile_s = [], 0.0
    start = end = None
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(batches(data, args.warmup + args.steps, args.batch, args.block, seed=1)):
        if step == 1:
            if cuda:
                torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0   # the first step: compilation and one-off set-up
        if step == args.warmup:
            if cuda:
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            else:
                t_start = time.perf_counter()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        for g in opt.param_groups:   # linear warm-up over the untimed steps, then constant
            g["lr"] = args.lr * min(1.0, (step + 1) / max(args.warmup, 1))
        ctx = torch.autocast(device.type, torch.bfloat16) if args.autocast else contextlib.nullcontext()
        with ctx:
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    if cuda:
        end.record()
        torch.cuda.synchronize()
        timed_s = start.elapsed_time(end) / 1e3
    else:
        timed_s = time.perf_counter() - t_start
    losses = torch.stack(losses).float().cpu().tolist()
    tokens = args.steps * args.batch * args.block
    return {"size": f"{layers}x{width}", "params": params, "variant": variant, "converted": len(converted),
            "linears": sum(isinstance(m, torch.nn.Linear) for m in model.modules()),
            "timed_s": timed_s, "tokens_per_s": tokens / timed_s, "first_step_s": compile_s,
            "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "losses": losses, "final_loss": statistics.mean(losses[-20:])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default="12x768,24x1024", help="comma-separated LAYERSxWIDTH")
    ap.add_argument("--variants", default="bf16,tensorwise,rowwise")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=100, help="timed steps")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps first (compilation falls here)")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--min-elements", type=int, default=1 << 20, help="hasten's rule: the smallest Linear converted")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--no-autocast", dest="autocast", action="store_false", help="bf16 autocast is on by default")
    ap.add_argument("--name", default="float8-gpt")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    variants = [v.strip() for v in args.variants.split(",")]
    bad = [v for v in variants if v not in ("bf16", "tensorwise", "rowwise")]
    if bad:
        raise SystemExit(f"--variants: {', '.join(bad)} unknown; use bf16, tensorwise, rowwise")
    data = torch.frombuffer(bytearray(TEXT.read_bytes()), dtype=torch.uint8).long()
    rows = []
    for size in map(parse_size, args.sizes.split(",")):
        for variant in variants:
            r = run(size, variant, args, data, device)
            rows.append(r)
            print(f"{r['size']} {variant}: {r['tokens_per_s']:,.0f} tok/s, first step {r['first_step_s']:.1f} s, "
                  f"loss {r['final_loss']:.4f}, {r['converted']}/{r['linears']} Linear converted", flush=True)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else None
    lines = []
    for r in rows:
        base = next(b for b in rows if b["size"] == r["size"] and b["variant"] == variants[0])
        diff = max(abs(a - b) for a, b in zip(r["losses"], base["losses"]))
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["max_loss_diff"] = diff
        mem = f"{r['peak_mem_gb']:.1f}" if r["peak_mem_gb"] is not None else "–"
        lines.append(f"| {r['size']} | {r['params'] / 1e6:.0f} M | {r['variant']} | {r['converted']}/{r['linears']} | "
                     f"{r['tokens_per_s']:,.0f} | {r['speedup']:.2f}x | {mem} | {r['first_step_s']:.1f} | "
                     f"{r['final_loss']:.4f} | {diff:.4f} |")
    md = (f"# Float8 against bf16 on a GPT ({gpu or args.device})\n\n"
          f"Batch {args.batch} x context {args.block} bytes of Tiny Shakespeare, AdamW (lr {args.lr}), "
          f"{'bf16 autocast, ' if args.autocast else ''}{'each block compiled, ' if args.compile else ''}"
          f"{args.warmup} untimed steps then {args.steps} timed; the same weights at the start and the same batches "
          "for every variant. Float8 through torchao (`convert_to_float8`: Linear layers with features multiples of 16 and "
          f"at least {args.min_elements:,} weights, the head left out).\n\n"
          "| size | parameters | variant | Linear converted | tokens/s | vs bf16 | peak GB | first step s | "
          "loss, last 20 steps | largest loss difference to bf16 |\n|---|---|---|---|---|---|---|---|---|---|\n"
          + "\n".join(lines) + "\n")
    write_results(args.name, {"device": gpu or args.device, "args": vars(args), "runs": rows}, md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
