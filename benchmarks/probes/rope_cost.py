"""Cost of rotary positions in one attention layer: hasten's form against the form it replaced.

hasten's GPT applies rotary positions as `x * cos + roll(x, D/2) * sin` with full-width tables
(`hasten.models.gpt.apply_rope`). Before commit 4b8ce92 it sliced each head into halves and
concatenated the two rotated halves; that form is restated here as the reference, and checked
to give the same outputs. Each row times forward and backward of one attention layer's
position work on the `shakespeare-char-fast` shapes (batch 24, 64 tokens, 4 heads of 32, qkv
from one projection, QK-norm, causal scaled-dot-product attention), on the CPU; "none" is the
same layer without positions. The forms alternate, `--iters` passes a round; the table gives
the median milliseconds a pass over `--rounds` rounds.

    python -m benchmarks.probes.rope_cost [--rounds 15] [--iters 30] [--name rope_cost]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks.tools.common import write_results
from hasten.models.gpt import apply_rope, rope_tables


def halves_and_concat(x, cos, sin):
    """The form before commit 4b8ce92: half-width tables, the head split into halves."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--name", default="rope_cost")
    a = ap.parse_args()
    if a.rounds < 1 or a.iters < 1:
        raise SystemExit("rope_cost: --rounds and --iters must be at least 1")
    B, T, H, D = 24, 64, 4, 32
    torch.manual_seed(0)
    qkv = torch.randn(B, T, 3 * H * D, requires_grad=True)
    cos, sin = rope_tables(T, D)
    half_cos, half_sin = cos[:, : D // 2], sin[:, D // 2:]   # the old tables: cos and sin of each angle once

    def layer(rope):
        q, k, v = qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
        q, k = F.rms_norm(q, (D,)), F.rms_norm(k, (D,))
        if rope is not None:
            q, k = rope(q), rope(k)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    forms = {"none": None,
             "halves and concatenation (before 4b8ce92)": lambda x: halves_and_concat(x, half_cos, half_sin),
             "x*cos + roll(x)*sin (hasten now)": lambda x: apply_rope(x, cos, sin)}
    with torch.no_grad():
        diff = (layer(forms["halves and concatenation (before 4b8ce92)"]) - layer(forms["x*cos + roll(x)*sin (hasten now)"]))
    same = float(diff.abs().max())
    times: dict[str, list[float]] = {k: [] for k in forms}
    for r in range(a.rounds + 1):   # round 0: warm-up, not kept
        for name, rope in forms.items():
            t = time.perf_counter()
            for _ in range(a.iters):
                layer(rope).sum().backward()
            if r:
                times[name].append((time.perf_counter() - t) / a.iters * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [f"| {k} | {v:.2f} | {v - med['none']:.2f} |" for k, v in med.items()]
    md = ("# Rotary positions: the cost of two forms in one attention layer (CPU, fp32)\n\n"
          f"Batch {B}, {T} tokens, {H} heads of {D}, QK-norm, causal attention; forward and backward; "
          f"{a.rounds} rounds of {a.iters} passes, the forms alternating. Largest output difference between the "
          f"two forms: {same:.1e}.\n\n"
          "| form | median ms a pass | ms over no positions |\n|---|---|---|\n" + "\n".join(rows))
    write_results(a.name, {"shape": [B, T, H, D], "rounds": a.rounds, "iters": a.iters, "max_abs_difference": same,
                           "ms_per_pass": times}, md)
    print(md)


if __name__ == "__main__":
    main()
