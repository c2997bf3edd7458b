"""The Trainer's per-step Python work, counted exactly: opcodes and Python calls per step.

Wall-clock overhead on a small shared machine is noisy (trainer_overhead.py's interval
spans several per cent); the number of Python opcodes the interpreter executes per training
step is not. This counts them with `sys.settrace` (opcode events) for the plain PyTorch loop
and for hasten's Trainer (bare; with a user's own loss), on a tiny model, as the difference
between a 400-step and a 200-step run (so set-up cancels out), and lists where hasten's
extra opcodes are spent. Tracing slows the loop down; only the counts are reported.

    python -m benchmarks.comparisons.trainer_opcodes
"""
from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.tools.common import write_results  # noqa: E402

from hasten import Trainer  # noqa: E402


def _count(mode: str, steps: int) -> tuple[int, int, dict]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,)))] * steps
    ops, calls, where = [0], [0], {}

    def tracer(frame, event, arg):
        if event == "call":
            calls[0] += 1
            frame.f_trace_opcodes = True
        elif event == "opcode":
            ops[0] += 1
            key = frame.f_code.co_filename.split("site-packages/")[-1].split("src/")[-1] + ":" + frame.f_code.co_name
            where[key] = where.get(key, 0) + 1
        return tracer

    if mode == "plain":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        sys.settrace(tracer)
        for x, y in data:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sys.settrace(None)
    else:
        loss_fn = (lambda o, t: F.cross_entropy(o, t)) if mode == "user loss" else None
        tr = Trainer(model, data, optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.01),
                     max_duration=f"{steps}ba", device="cpu", loss_fn=loss_fn, log_interval="1000000ba")
        sys.settrace(tracer)
        tr.fit()
        sys.settrace(None)
    return ops[0], calls[0], where


def main():
    torch.set_num_threads(1)
    rows, data = [], {"summary": {}}
    for mode in ("plain", "hasten", "user loss"):
        a_ops, a_calls, a_where = _count(mode, 200)
        b_ops, b_calls, b_where = _count(mode, 400)
        per_ops, per_calls = (b_ops - a_ops) / 200, (b_calls - a_calls) / 200
        hot = {k: (b_where.get(k, 0) - a_where.get(k, 0)) / 200 for k in b_where}
        hasten_hot = {k: v for k, v in sorted(hot.items(), key=lambda kv: -kv[1]) if k.startswith("hasten/") and v}
        data["summary"][mode] = {"opcodes_per_step": per_ops, "python_calls_per_step": per_calls,
                                 "hasten_opcodes_by_function": hasten_hot}
        rows.append(f"| {mode} | {per_ops:.0f} | {per_calls:.0f} |")
    plain = data["summary"]["plain"]["opcodes_per_step"]
    detail = "\n".join(f"| `{k}` | {v:.0f} |" for k, v in data["summary"]["hasten"]["hasten_opcodes_by_function"].items())
    md = ("# Python work per training step (tiny model, opcodes counted by sys.settrace)\n\n"
          "| loop | opcodes per step | Python calls per step |\n|---|---|---|\n" + "\n".join(rows)
          + f"\n\nhasten adds {data['summary']['hasten']['opcodes_per_step'] - plain:.0f} opcodes per step over the "
          "plain loop; where they are spent:\n\n| function | opcodes per step |\n|---|---|\n" + detail + "\n")
    write_results("trainer_opcodes", data, md)
    print(md)


if __name__ == "__main__":
    main()
