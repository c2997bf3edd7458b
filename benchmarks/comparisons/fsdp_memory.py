"""Memory per rank: sharded training (FSDP2, both resharding styles) against DDP, for a GPT
whose parameters and optimizer state dominate (12 layers, width 768, AdamW), two processes
on the CPU (gloo), through hasten's Trainer.

Per rank it records the peak resident memory of the process (what the machine must hold)
and the bytes of this rank's parameters and optimizer state after training (the sharded
part), beside the formulas of docs/distributed.md: with P parameters in fp32 and AdamW's two
states, DDP holds 4P (parameters) + 8P (optimizer) + 4P (gradients) + 4P (DDP's gradient
buckets) per rank; FSDP holds (4P + 8P + 4P) / W at rest, plus the gathered parameters of the
blocks being computed.

    python -m benchmarks.comparisons.fsdp_memory [--layers 12 --width 768 --steps 3]

Writes benchmarks/results/fsdp_memory.json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = {"none (1 process)": ("none", None, 1), "ddp": ("ddp", None, 2), "fsdp, reshard after forward (ZeRO-3)":
         ("fsdp", True, 2), "fsdp, keep for backward (ZeRO-2 style)": ("fsdp", False, 2)}


def worker(args) -> None:
    import torch

    from hasten import Trainer, make_runtime
    from hasten.data import RandomWindows
    from hasten.models.gpt import GPT, GPTConfig
    rt = make_runtime(device="cpu", seed=0, parallelism=args.parallelism)
    model = GPT(GPTConfig(n_layer=args.layers, n_head=args.width // 64, n_embd=args.width, vocab_size=65,
                          block_size=64, dropout=0.0))
    n_params = sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, 65, (20000,), generator=torch.Generator().manual_seed(0))
    fsdp = {"reshard_after_forward": args.reshard == "1"} if args.parallelism == "fsdp" else None
    tr = Trainer(model, RandomWindows(tokens, 64, 4, seed=0), max_duration=f"{args.steps}ba", runtime=rt,
                 optimizers=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-4), fsdp=fsdp, log_interval="1000ba")
    built_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # the high-water mark before training
    tr.fit()

    def local_bytes(ts):
        return sum((t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size() for t in ts)
    params = local_bytes(list(tr.state.model.parameters()))
    opt = local_bytes([v for s in tr.state.optimizers[0].state.values() for v in s.values()
                       if isinstance(v, torch.Tensor) and v.dim() > 0])
    row = {"rank": rt.world.rank, "world": rt.world.size, "params_total": n_params,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "peak_rss_before_fit_mb": built_mb,
           "param_bytes_mb": params / 2**20, "optimizer_bytes_mb": opt / 2**20}
    Path(f"{args.out}.rank{rt.world.rank}").write_text(json.dumps(row))
    rt.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--parallelism", help=argparse.SUPPRESS)
    ap.add_argument("--reshard", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    from benchmarks.tools.common import machine, write_results
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, (parallelism, reshard, nproc) in MODES.items():
            out = Path(tmp) / parallelism
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                   __file__, "--worker", "--parallelism", parallelism, "--reshard", "1" if reshard else "0",
                   "--out", str(out), "--layers", str(args.layers), "--width", str(args.width), "--steps", str(args.steps)]
            print("$", label, flush=True)
            subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for r in range(nproc):
                rows.append({"mode": label, **json.loads(Path(f"{out}.rank{r}").read_text())})
    p = rows[0]["params_total"]
    mb = 2**20
    formula = {"none (1 process)": 16 * p / mb, "ddp": 20 * p / mb,
               "fsdp, reshard after forward (ZeRO-3)": 16 * p / 2 / mb, "fsdp, keep for backward (ZeRO-2 style)": 16 * p / 2 / mb}
    base = {r["mode"]: r["peak_rss_mb"] for r in rows if r["rank"] == 0}
    lines = [f"# Memory per rank: FSDP against DDP (GPT {args.layers} layers x {args.width}, {p / 1e6:.1f} M parameters, "
             "AdamW, fp32, 2 processes on the CPU)", "",
             "| mode | rank | peak resident MB before fit | peak resident MB | parameters MB (this rank) | "
             "optimizer state MB (this rank) | model state at rest by formula, MB | peak vs ddp |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['rank']} | {r['peak_rss_before_fit_mb']:.0f} | {r['peak_rss_mb']:.0f} | "
                     f"{r['param_bytes_mb']:.0f} | "
                     f"{r['optimizer_bytes_mb']:.0f} | {formula[r['mode']]:.0f} | "
                     f"{r['peak_rss_mb'] / base['ddp']:.2f} |")
    lines += ["", "Formula (model state at rest per rank, P parameters in fp32, AdamW): one process 16P bytes "
              "(parameters, gradients, two optimizer states); DDP 20P (plus its gradient buckets); FSDP 16P / W. "
              "Peak resident memory adds the torch runtime (a few hundred MB per process), activations and, "
              "under FSDP, the gathered parameters of the blocks in flight.", "",
              f"Machine: {machine()['cpu']}, {machine()['cores']} cores"]
    write_results("fsdp_memory", {"rows": rows, "formula_mb": formula}, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
