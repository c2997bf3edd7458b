"""modded-nanogpt's procedure at the scale of `prose-gpt-fast`: the language-model peer of hasten's
fastest GPT recipe.

hasten's own plain-PyTorch rendering of KellerJordan/modded-nanogpt's `train_gpt.py` (the record
line of late 2026, read at upstream commit 40fe836; written from its description, not its code),
scaled to the prose GPT: 6 layers of width 320 (5 heads of 64), the 8,192-token BPE of hasten's
prose corpus, windows of 256 tokens, and the token budget of `prose-gpt-fast` (300 steps of 16
windows on average). What is kept, step by step:

- optimizer: NorMuon for the hidden matrices (Nesterov momentum by lerp, 0.85 -> 0.95 over the
  first 23% of steps and back to 0.85 over the last 4%; Polar Express orthogonalisation with its
  five published coefficient triples, in bf16, on the operand normalised to spectral norm <= 1;
  NorMuon's low-rank second moment (beta2 0.9) along the longer side; lr 0.023 x max(1,
  rows/cols)^0.5, the MLP output projections 2x; cautious weight decay 1.2 scaled by lr x lr),
  Adam for everything else (lr 0.008, eps 1e-10, cautious decay 0.005 scaled by lr^2, the
  per-parameter betas, lr and decay multipliers of upstream's table: embedding and head
  0.5/0.95 with decay x150, value embeddings 0.75/0.95 with lr x75 and decay x5, scalars lr x5,
  gains and lambdas without decay), stepped on odd steps only with the gradients of both steps
  summed; the loss a sum over tokens, as upstream;
- schedule: three stages of a third each with batch 8, 16 and 24 windows and lr multipliers 1.0,
  1.52, 1.73, a linear cooldown over the last 60% of the scheduled steps to 0.15, then an
  extension of 1.2% of the steps at the final rate; multi-token prediction weights [1, .5,
  .25 -> 0] -> [1, .5 -> 0] -> [1]; sliding attention windows (short, long) of (1, 3), (3, 7),
  (5, 11) and (6, 13) blocks, scaled from upstream's 128-token blocks of a 2,048-token sequence
  to 16-token blocks of a 256-token window, with YaRN's frequency interpolation and attention
  scale (x (0.2 ln(new/old) + 1)) at each change of the long window, and the long window
  widened to 20 blocks for the final evaluation; the embedding tied to the head (stored
  transposed) until the first odd step of the third stage, where Adam's state is copied over;
  untimed warm-up steps, then the model and optimizer reset, as upstream;
- model: pre-norm by RMS norm without gains; QK-norm; rotary positions on half the head
  dimensions (base 1024; the other half stationary) and, in long-window layers, the stationary
  half of each key shifted one position forward; attention scale 0.1; sa_lambdas (0.5, 1.0)
  on the QKV and output weights; value-embedding tables (N(0, 0.01)) for the attention layers but the first with
  per-head gates 2 sigma(W [x[:6], ve[:6]]); a layer without attention at 6/11 of the depth
  fed by a sigma(-1.5)-gated skip from an earlier layer; residual lambdas sqrt(1.1) and post
  lambdas 1 per sublayer; the embedding injected again in every layer through a gate
  starting at 0; the token smear gate; ReLU-squared MLP of 4x width; uniform init with bound
  sqrt(3) x 0.5 / sqrt(width), zero output projections, head N(0, 0.005); a backout of half the
  residual at 2/3 of the depth; logits soft-capped by 23 sigma((z + 5) / 7.5).

Deviations, each for a reason:
- bf16 autocast over fp32 weights on a CPU with bf16 hardware (fp32 elsewhere, the same rule as
  hasten's precision: auto) instead of bf16 weights with mantissa tracking and FP8 matmuls
  (no FP8 on a CPU); no torch.compile, Triton or flash-attention kernels (CPU; hasten's side is
  not compiled either); attention through scaled_dot_product_attention with a band mask;
- windows of 256 tokens read in order through the training tokens, every seed the same order
  (upstream: the same order too, but documents start-aligned and attention kept inside each
  document by varlen flash attention; hasten's side attends across documents as well), and no
  sequence-length schedule (896 -> 2,048 upstream; the stage-one attention windows already keep
  attention short);
- left out, each a later record's addition that needs upstream's scale or kernels: MUDD dense
  connections (their gates here are fixed learnable scalars at upstream's initial values: skip
  0.5, backout 0.5, embedding injection 0), gated XSA, DC attention, attention gates, paired
  heads, the hashed bigram embedding (its table would be twice the model), the layer-7 input
  snapshot for the last layers, and per-head-pair grouping of Q and K for NorMuon (five heads do
  not pair: each head's Q and K is its own matrix);
- Q and K orthogonalised per head, V and O per layer, each MLP matrix on its own (upstream's
  banks group the same matrices for sharding; the update of each matrix is the same);
- no gradient communication (one process).

Size: the hidden matrices hold 6.96M weights (hasten's prose GPT: 7.37M; one layer has no
attention, as upstream's), but the lookup tables are larger than the model, as upstream's are:
four value-embedding tables (10.5M) and, after the split, an embedding and a head of 2.6M each,
22.7M parameters in all against the prose GPT's 10.1M. A lookup table costs memory and its
optimizer step, not matrix products.

Scored with hasten's metric: the mean cross-entropy over the first 131,072 held-out tokens in
non-overlapping windows of 256 (hasten's val/loss for the prose recipes). Timed: the training
steps (evaluations and the warm-up excluded), as upstream times them.

    python -m benchmarks.comparisons.peers.modded_nanogpt --tokens TOKENS.npz --seed 0 [--out runs.jsonl]

TOKENS.npz holds `train` and `val` token arrays (benchmarks/comparisons/lm_vs_modded.py writes it
from hasten's prose corpus and tokenizer, so both sides read the same tokens).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import resource
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# the scale of prose-gpt-fast
VOCAB, LAYERS, HEADS, HEAD_DIM, DIM, SEQ = 8192, 6, 5, 64, 320, 256
EVAL_TOKENS = 131072
# upstream's schedule: 1285 scheduled + 15 extension steps; here prose-gpt-fast's budget
SCHEDULED, EXTENSION = 300, round(300 * 15 / 1285)
BLOCK = SEQ * 128 // 2048                   # upstream's 128-token window unit, scaled to the sequence
STAGES = [  # (batch in windows, (short, long) windows in blocks, lr multiplier, MTP weights start, end)
    (8, (1, 3), 1.0, [1.0, 0.5, 0.25], [1.0, 0.5, 0.0]),
    (16, (3, 7), 1.52, [1.0, 0.5], [1.0, 0.0]),
    (24, (5, 11), 1.73, [1.0], [1.0]),
    (24, (6, 13), 1.0, [1.0], [1.0]),      # extension stage
]
FINAL_LONG_WINDOW = 20
COOLDOWN_FRAC, FINAL_LR = 0.60, 0.15
MOMENTUM_WARMUP = round((SCHEDULED + EXTENSION) * 300 / 1300)
MOMENTUM_COOLDOWN = round((SCHEDULED + EXTENSION) * 50 / 1300)
POLAR_EXPRESS = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
                 (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                 (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                 (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                 (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]
NO_ATTN_LAYER = round(6 * LAYERS / 11)      # 3: upstream skips attention in layer 6 of 11
SKIP_FROM = round(3 * LAYERS / 11)          # 2: upstream's skip comes from layer 3's output
BACKOUT_FROM = round(7 * LAYERS / 11)       # 4: upstream backs out the residual after layer 7
LONG_LAYERS = {round(3 * LAYERS / 11), LAYERS - 1}   # upstream: layers 3 and 10 of 11 take the long window
# value embeddings: upstream gives every attention layer but the first and those of the middle
# one (with 6 layers its rule leaves out layer 0 alone); the layer without attention has none
VE_LAYERS = [i for i in range(1, LAYERS) if i != NO_ATTN_LAYER]
ADAM = dict(lr=0.008, eps=1e-10, weight_decay=0.005)
NORMUON = dict(lr=0.023, beta2=0.9, weight_decay=1.2)
ADAM_TABLE = {  # name: (betas, lr_mul, wd_mul), upstream's table
    "scalars": ((0.9, 0.99), 5.0, 0.0), "smear_gate": ((0.9, 0.99), 0.01, 0.0), "ve_gate": ((0.9, 0.99), 1.0, 1.0),
    "lm_head": ((0.5, 0.95), 1.0, 150.0), "embed": ((0.5, 0.95), 1.0, 150.0),
    "value_embeds": ((0.75, 0.95), 75.0, 5.0), "post_lambdas": ((0.9, 0.95), 1.0, 0.0),
    "resid_lambdas": ((0.9, 0.95), 5.0, 0.0)}


def stage_bounds():
    ends = [round(SCHEDULED * k / 3) for k in range(1, 3)] + [SCHEDULED, SCHEDULED + EXTENSION]
    return list(zip([0] + ends[:-1], ends))


def lookup(step: int):
    for (start, end), stage in zip(stage_bounds(), STAGES):
        if step < end:
            return stage, (step - start) / (end - start)
    return STAGES[-1], 1.0


def lr_factor(step: int) -> float:
    lr = lookup(step)[0][2]
    cd = int(SCHEDULED * (1 - COOLDOWN_FRAC))
    if step >= cd:
        t = min(1.0, (step - cd) / (SCHEDULED - cd))
        lr = lr * (1 - t) + FINAL_LR * t
    return lr


def momentum(step: int, lo=0.85, hi=0.95) -> float:
    cd = SCHEDULED + EXTENSION - MOMENTUM_COOLDOWN
    if step < MOMENTUM_WARMUP:
        return lo + step / MOMENTUM_WARMUP * (hi - lo)
    if step > cd:
        return hi - (step - cd) / MOMENTUM_COOLDOWN * (hi - lo)
    return hi


def mtp_weights(step: int) -> list[float]:
    stage, t = lookup(step)
    return [a + (b - a) * t for a, b in zip(stage[3], stage[4])]


def rms(x):
    return F.rms_norm(x, (x.size(-1),))


class Rotary:
    """Half-truncated rotary positions (base 1024) with YaRN's interpolation on a window change."""

    def __init__(self):
        f = (1 / 1024) ** torch.linspace(0, 1, HEAD_DIM // 4)
        self.freq = torch.cat([f.repeat_interleave(2), torch.zeros(HEAD_DIM // 2)])
        self.attn_scale = 0.1
        self._tables()

    def _tables(self):
        theta = torch.outer(torch.arange(2 * SEQ, dtype=torch.float32), self.freq)
        self.cos, self.sin = theta.cos(), theta.sin()
        self.sin[..., 1::2] *= -1

    def apply(self, old: int, new: int, alpha=1, beta=32):
        rotations = old * self.freq / (2 * math.pi)
        s = old / new
        w = torch.clamp((rotations - alpha) / (beta - alpha), 0, 1)
        self.freq = self.freq * (s + w * (1 - s))
        self._tables()
        self.attn_scale *= 0.2 * math.log(new / old) + 1

    def __call__(self, x):   # x: (B, T, H, D); adjacent dimensions rotate as pairs
        t = x.size(1)
        flip = x.view(*x.shape[:-1], -1, 2).flip(-1).view(x.shape)
        return self.cos[None, :t, None].to(x.dtype) * x + self.sin[None, :t, None].to(x.dtype) * flip


class ModdedGPT(nn.Module):
    def __init__(self):
        super().__init__()
        bound = 3 ** 0.5 * 0.5 * DIM ** -0.5
        u = lambda *shape: nn.Parameter(torch.empty(*shape).uniform_(-bound, bound))  # noqa: E731
        self.lm_head = nn.Parameter(torch.randn(DIM, VOCAB) * 0.005)          # stored transposed, as upstream
        self.embed = nn.Parameter(self.lm_head.detach().T.clone())
        self.value_embeds = nn.Parameter(0.01 * torch.randn(len(VE_LAYERS), VOCAB, DIM))
        self.ve_gate = nn.Parameter(torch.zeros(len(VE_LAYERS), HEADS, 12))
        attn_layers = [i for i in range(LAYERS) if i != NO_ATTN_LAYER]
        self.attn_layers = attn_layers
        # parameter banks, as upstream: each matrix of a bank is orthogonalised on its own
        self.qk_bank = u(len(attn_layers) * 2 * HEADS, HEAD_DIM, DIM)   # per layer: the heads' Q, then their K
        self.vo_bank = u(len(attn_layers) * 2, DIM, DIM)                # per layer: V, O
        self.mlp_bank = u(LAYERS * 2, 4 * DIM, DIM)                     # per layer: c_fc, c_proj (used transposed)
        with torch.no_grad():
            self.mlp_bank[1::2].zero_()
        self.smear_gate = nn.Parameter(torch.zeros(1, 12))
        self.resid_lambdas = nn.Parameter(torch.full((LAYERS, 2), 1.1 ** 0.5))
        self.post_lambdas = nn.Parameter(torch.ones(LAYERS, 2))
        # sa_lambdas per layer (0.5, 1.0), smear 0, skip -1.5, skip gate 0.5, backout 0.5, x0 gates 0
        self.scalars = nn.Parameter(torch.cat([torch.tensor([0.5, 1.0]).repeat(LAYERS), torch.tensor([0.0, -1.5, 0.5, 0.5]),
                                               torch.zeros(LAYERS)]))
        self.rotary = Rotary()
        self._masks: dict = {}

    def mask(self, t: int, window: int):
        key = (t, window)
        if key not in self._masks:
            i = torch.arange(t)
            d = i[:, None] - i[None, :]
            self._masks[key] = (d >= 0) & (d <= window)
        return self._masks[key]

    def forward(self, idx, windows: tuple[int, int]):
        B, T = idx.shape
        s = self.scalars
        sa = s[:2 * LAYERS].view(LAYERS, 2)
        smear_lambda, skip_lambda, skip_gate, backout = s[2 * LAYERS:2 * LAYERS + 4]
        x0_gates = s[2 * LAYERS + 4:]
        x = F.embedding(idx, self.embed)
        smear = smear_lambda * torch.sigmoid(x[:, 1:, :12] @ self.smear_gate.T.to(x.dtype))
        x = torch.cat([x[:, :1], x[:, 1:] + smear * x[:, :-1]], dim=1)
        x = x0 = rms(x)
        cache = {}
        for i in range(LAYERS):
            if i == NO_ATTN_LAYER:
                x = x + torch.sigmoid(skip_lambda) * skip_gate * cache[SKIP_FROM]
            else:
                a = self.attn_layers.index(i)
                h = rms(x)
                wqk = self.qk_bank[a * 2 * HEADS:(a + 1) * 2 * HEADS].reshape(2 * DIM, DIM)
                q, k = F.linear(h, sa[i, 0] * wqk).view(B, T, 2 * HEADS, HEAD_DIM).chunk(2, dim=2)
                v = F.linear(h, sa[i, 0] * self.vo_bank[2 * a]).view(B, T, HEADS, HEAD_DIM)
                q, k = self.rotary(rms(q)), self.rotary(rms(k))
                long = i in LONG_LAYERS
                if long:   # the stationary half of each key one position forward
                    k = torch.cat([k[..., :HEAD_DIM // 2],
                                   torch.cat([k[:, :1, :, HEAD_DIM // 2:], k[:, :-1, :, HEAD_DIM // 2:]], 1)], -1)
                if i in VE_LAYERS:
                    j = VE_LAYERS.index(i)
                    ve = F.embedding(idx, self.value_embeds[j]).to(h.dtype)
                    gate = 2 * torch.sigmoid(F.linear(torch.cat([h[..., :6], ve[..., :6]], -1), self.ve_gate[j].to(h.dtype)))
                    v = v + gate[..., None] * ve.view(B, T, HEADS, HEAD_DIM)
                window = windows[1] if long else windows[0]
                q, k, v = (z.transpose(1, 2) for z in (q, k, v))
                if window >= T - 1:
                    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.rotary.attn_scale)
                else:
                    y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask(T, window), scale=self.rotary.attn_scale)
                y = F.linear(y.transpose(1, 2).reshape(B, T, DIM), sa[i, 1] * self.vo_bank[2 * a + 1])
                x = self.resid_lambdas[i, 0] * x + self.post_lambdas[i, 0] * y + x0_gates[i] * x0
            hdn = F.relu(F.linear(rms(x), self.mlp_bank[2 * i])).square()
            x = self.resid_lambdas[i, 1] * x + self.post_lambdas[i, 1] * (hdn @ self.mlp_bank[2 * i + 1].to(hdn.dtype))
            cache[i] = x
        x = rms(x - backout * cache[BACKOUT_FROM])
        logits = x @ self.lm_head.to(x.dtype)
        return 23 * torch.sigmoid((logits.float() + 5) / 7.5)


def loss_sum(logits, targets, weights: list[float]):
    """Multi-token prediction as upstream: position t's logits scored against the next token and,
    with weight w_k, the token k further on; summed over positions."""
    lse = torch.logsumexp(logits, -1)
    total = 0.0
    for k, w in enumerate(weights):
        if w <= 0:
            continue
        z = logits[:, :logits.size(1) - k].gather(-1, targets[:, k:, None]).squeeze(-1)
        total = total + w * (lse[:, :logits.size(1) - k] - z).sum()
    return total


def polar_express(g: torch.Tensor) -> torch.Tensor:
    """Each matrix of a bank (..., rows, cols) orthogonalised: normalised to spectral norm <= 1,
    then the five Polar Express steps X <- aX + (bA + cA^2)X with A = XX^T on the wide side."""
    x = g.bfloat16()
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * (1 + 2e-2) + 1e-6)
    for a, b, c in POLAR_EXPRESS:
        A = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(A, A, A, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


class NorMuonAndAdam:
    """NorMuon for the hidden matrices, Adam (odd steps only) for the rest, with upstream's
    cautious weight decay and per-parameter multipliers."""

    def __init__(self, model: ModdedGPT):
        self.model = model
        self.muon = []
        for p in (model.qk_bank, model.vo_bank, model.mlp_bank):
            n, rows, cols = p.shape
            mul = torch.ones(n, 1, 1)
            if p is model.mlp_bank:
                mul[1::2] = 2.0          # the MLP output projections: twice the rate
            red = -1 if rows >= cols else -2
            second = torch.zeros(n, rows, 1) if red == -1 else torch.zeros(n, 1, cols)
            self.muon.append(dict(p=p, lr_mul=max(1.0, rows / cols) ** 0.5 * mul, red=red, buf=torch.zeros_like(p),
                                  second=second))
        self.adam = {}
        for name, (betas, lr_mul, wd_mul) in ADAM_TABLE.items():
            p = getattr(model, name)
            self.adam[name] = dict(p=p, betas=betas, lr_mul=lr_mul, wd_mul=wd_mul, step=0,
                                   m=torch.zeros_like(p), v=torch.zeros_like(p))
        self.split = False

    def state(self):
        return copy.deepcopy(({n: {k: v for k, v in s.items() if k != "p"} for n, s in self.adam.items()},
                              [{k: v for k, v in s.items() if k != "p"} for s in self.muon], self.split))

    def load(self, state):
        adam, muon, self.split = copy.deepcopy(state)
        for n, s in adam.items():
            self.adam[n].update(s)
        for mine, s in zip(self.muon, muon):
            mine.update(s)

    @torch.no_grad()
    def step(self, step: int, lr_f: float, mom: float):
        for s in self.muon:
            p = s["p"]
            g = p.grad.float()
            s["buf"].lerp_(g, 1 - mom)
            u = polar_express(g.lerp_(s["buf"], mom)).float()
            # NorMuon: a second moment of the rows (or columns), the update rescaled to its former norm
            red, n = s["red"], u.size(s["red"])
            v_mean = u.square().mean(dim=red, keepdim=True)
            v_norm = (v_mean.sum(dim=(-2, -1), keepdim=True) * n).sqrt()
            s["second"].lerp_(v_mean, 1 - NORMUON["beta2"])
            step_size = s["second"].clamp_min(1e-10).rsqrt()
            new_norm = ((v_mean * n) * step_size.square()).sum(dim=(-2, -1), keepdim=True).sqrt()
            u = u * (step_size * (v_norm / new_norm.clamp_min(1e-10)))
            lr = NORMUON["lr"] * lr_f
            eff_lr, eff_wd = lr * s["lr_mul"], NORMUON["weight_decay"] * lr
            mask = (u * p) >= 0
            p.sub_(p * mask * eff_wd * eff_lr + u * eff_lr)
            p.grad = None
        if step % 2 == 0:     # Adam on odd steps; its gradients keep accumulating until then
            return
        embed, head = self.model.embed, self.model.lm_head
        if not self.split:
            head.grad.add_(embed.grad.T)
        for name, s in self.adam.items():
            p = s["p"]
            if name == "embed" and not self.split:
                continue
            b1, b2 = s["betas"]
            s["step"] += 1
            t = s["step"]
            lr = ADAM["lr"] * lr_f * s["lr_mul"]
            s["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
            s["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            upd = s["m"].div(s["v"].sqrt().add_(ADAM["eps"])).mul_(lr * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t))
            upd.addcmul_(p, ((upd * p) > 0).to(p.dtype), value=lr * lr * ADAM["weight_decay"] * s["wd_mul"])
            p.sub_(upd)
        if not self.split:
            embed.copy_(head.T)
        for s in self.adam.values():
            s["p"].grad = None

    def untie(self):
        """At the split step: the embedding gets the head's Adam state, transposed."""
        e, h = self.adam["embed"], self.adam["lm_head"]
        e["m"].copy_(h["m"].T)
        e["v"].copy_(h["v"].T)
        e["step"] = h["step"]
        self.split = True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", required=True, help=".npz with `train` and `val` token arrays")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto")
    ap.add_argument("--steps", type=int, default=None, help="stop after this many steps (a smoke run)")
    ap.add_argument("--eval-every", type=int, default=60, help="untimed evaluations (upstream: every 250 of 1300 steps)")
    ap.add_argument("--out", help="append one JSON line with the result")
    ap.add_argument("--comparison", help="the results folder this run is made for (recorded)")
    ap.add_argument("--order", type=int, help="this run's place in the comparison's run order (recorded)")
    args = ap.parse_args(argv)
    from hasten.provenance import run_provenance
    provenance = run_provenance(args.comparison, args.order)
    data = np.load(args.tokens)
    train = torch.from_numpy(data["train"].astype(np.int64))
    val = torch.from_numpy(data["val"][:EVAL_TOKENS + 1].astype(np.int64))
    if args.precision == "auto":
        flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
        args.precision = "bf16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "fp32"
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.precision == "bf16" else nullcontext
    torch.manual_seed(args.seed)
    model = ModdedGPT()
    opt = NorMuonAndAdam(model)
    total = SCHEDULED + EXTENSION
    split_step = stage_bounds()[2][0] | 1
    sched = {"long": STAGES[0][1][1]}
    pos = [0]

    def batch(b: int):
        n = b * SEQ
        if pos[0] + n + 1 > len(train):
            pos[0] = 0
        x = train[pos[0]:pos[0] + n].view(b, SEQ)
        y = train[pos[0] + 1:pos[0] + n + 1].view(b, SEQ)
        pos[0] += n
        return x, y

    def advance(step: int):
        stage = lookup(step)[0]
        if stage[1][1] != sched["long"]:
            model.rotary.apply(sched["long"] * BLOCK, stage[1][1] * BLOCK)
            sched["long"] = stage[1][1]
        return stage

    def train_step(step: int):
        stage = advance(step)
        x, y = batch(stage[0])
        with autocast():
            logits = model(x, (stage[1][0] * BLOCK, stage[1][1] * BLOCK))
        loss_sum(logits, y, mtp_weights(step)).backward()
        opt.step(step, lr_factor(step), momentum(step))
        if step == split_step:
            opt.untie()

    @torch.no_grad()
    def evaluate(at: int, long_blocks: int) -> float:
        """hasten's metric at step `at`, with that step's short window and `long_blocks` for the long one."""
        windows = (lookup(min(at, total - 1))[0][1][0] * BLOCK, long_blocks * BLOCK)
        m = (len(val) - 1) // SEQ
        xs, ys = val[:m * SEQ].view(m, SEQ), val[1:m * SEQ + 1].view(m, SEQ)
        tot = 0.0
        for i in range(0, m, 32):
            with autocast():
                logits = model(xs[i:i + 32], windows)
            tot += F.cross_entropy(logits.flatten(0, 1), ys[i:i + 32].flatten(), reduction="sum").item()
        return tot / ys.numel()

    # upstream's warm-up: a few steps at the shapes to come, untimed, then model and optimizer reset
    initial = (copy.deepcopy(model.state_dict()), opt.state(), copy.deepcopy(model.rotary.__dict__))
    for step in (0, 1):
        train_step(step)
    model.load_state_dict(initial[0])
    opt.load(initial[1])
    model.rotary.__dict__.update(copy.deepcopy(initial[2]))
    sched["long"], pos[0] = STAGES[0][1][1], 0
    for p in model.parameters():
        p.grad = None

    timed, curve = 0.0, []
    stop = min(total, args.steps or total)
    for step in range(stop + 1):
        if step == stop or (args.eval_every and step % args.eval_every == 0 and step):
            last = step == stop
            curve.append({"step": step, "timed_s": timed, "val_loss": evaluate(step, FINAL_LONG_WINDOW if last else sched["long"])})
            print(json.dumps({"step": step, "timed_s": round(timed, 2), "val_loss": round(curve[-1]["val_loss"], 4)}),
                  file=sys.stderr, flush=True)
        if step == stop:
            break
        t = time.perf_counter()
        train_step(step)
        timed += time.perf_counter() - t
    result = {"peer": "modded-nanogpt (hasten's rendering, 40fe836)", "seed": args.seed, "val_loss": curve[-1]["val_loss"],
              "timed_s": timed, "steps": stop, "tokens": sum(lookup(s)[0][0] for s in range(stop)) * SEQ,
              "precision": args.precision, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "threads": torch.get_num_threads(), "torch": torch.__version__, "curve": curve, "provenance": provenance}
    print(json.dumps({k: v for k, v in result.items() if k not in ("curve", "provenance")}))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
