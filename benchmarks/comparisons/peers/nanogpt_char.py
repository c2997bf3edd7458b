"""nanoGPT's Tiny Shakespeare procedure on a CPU: the language-model peer of
`shakespeare-char-baseline` and `shakespeare-char-fast`.

hasten's own plain-PyTorch rendering of what nanoGPT's `train.py` does with its documented
CPU command (config/train_shakespeare_char.py with --device=cpu --compile=False
--eval_iters=20 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
--max_iters=2000 --lr_decay_iters=2000 --dropout=0.0), written from its description, not its
code:

- data: the characters of Tiny Shakespeare (a vocabulary of 65), the first 90% for training;
  each batch 12 random windows of 64 characters (uniform random starts), targets shifted by one;
- model: a GPT-2 style transformer (pre-norm, LayerNorm without bias, causal self-attention
  through scaled_dot_product_attention, GELU MLP of 4x width, no biases, dropout 0), learned
  positions, the token embedding tied to the output head; weights N(0, 0.02), the residual
  output projections N(0, 0.02 / sqrt(2 x layers));
- training: AdamW (betas 0.9/0.99, eps 1e-8) with weight decay 0.1 on the matrices only; the
  learning rate warms up linearly over 100 iterations to 1e-3, then follows a cosine to 1e-4 at
  iteration 2000; gradients clipped to norm 1.0; fp32; 2000 iterations;
- nanoGPT's own evaluation (every 250 iterations, 20 random batches of each split) is done
  (untimed, it is part of the procedure) but the final model is scored with hasten's metric:
  the mean cross-entropy over every non-overlapping 64-character window of the held-out 10%.

It uses nothing from hasten but the packaged text, read without importing hasten (so its
memory is a plain PyTorch process's). Timed: the training iterations (evaluations excluded). Reported: the final
validation loss, the timed seconds, and the process's peak resident memory.

    python -m benchmarks.comparisons.peers.nanogpt_char --seed 0 [--out runs.jsonl]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import resource
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

CFG = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, max_iters=2000, lr=1e-3, min_lr=1e-4,
           warmup_iters=100, lr_decay_iters=2000, weight_decay=0.1, beta1=0.9, beta2=0.99, grad_clip=1.0,
           eval_interval=250, eval_iters=20)


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.fc, self.out = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        d, n = CFG["n_embd"], CFG["n_layer"]
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(CFG["block_size"], d)
        self.blocks = nn.ModuleList(Block(d, CFG["n_head"]) for _ in range(n))
        self.ln = nn.LayerNorm(d, bias=False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def learning_rate(it: int) -> float:
    if it < CFG["warmup_iters"]:
        return CFG["lr"] * (it + 1) / (CFG["warmup_iters"] + 1)
    if it > CFG["lr_decay_iters"]:
        return CFG["min_lr"]
    ratio = (it - CFG["warmup_iters"]) / (CFG["lr_decay_iters"] - CFG["warmup_iters"])
    return CFG["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (CFG["lr"] - CFG["min_lr"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="append one JSON line with the result")
    args = ap.parse_args(argv)
    # hasten's packaged copy of the text, found without importing hasten (the peer's memory is its own)
    package = importlib.util.find_spec("hasten").submodule_search_locations[0]
    text = (Path(package) / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(ids))
    train, val = ids[:n], ids[n:]
    torch.manual_seed(1337 + args.seed)
    model = GPT(len(chars))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": CFG["weight_decay"]}, {"params": other, "weight_decay": 0.0}],
                            lr=CFG["lr"], betas=(CFG["beta1"], CFG["beta2"]))
    bs, T = CFG["batch_size"], CFG["block_size"]

    def batch(split):
        data = train if split == "train" else val
        ix = torch.randint(len(data) - T, (bs,))
        return torch.stack([data[i:i + T] for i in ix]), torch.stack([data[i + 1:i + 1 + T] for i in ix])

    @torch.no_grad()
    def estimate():
        model.eval()
        out = {}
        for split in ("train", "val"):
            losses = [F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                      for x, y in (batch(split) for _ in range(CFG["eval_iters"]))]
            out[split] = sum(losses) / len(losses)
        model.train()
        return out

    timed = 0.0
    log = []
    for it in range(CFG["max_iters"] + 1):
        if it % CFG["eval_interval"] == 0:
            log.append({"iter": it, **estimate()})
        if it == CFG["max_iters"]:
            break
        t = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = learning_rate(it)
        x, y = batch("train")
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CFG["grad_clip"])
        opt.step()
        timed += time.perf_counter() - t
    # hasten's metric: every non-overlapping window of the held-out text
    model.eval()
    m = (len(val) - 1) // T
    x, y = val[: m * T].view(m, T), val[1: m * T + 1].view(m, T)
    with torch.no_grad():
        total = sum(F.cross_entropy(model(x[i:i + 64]).flatten(0, 1), y[i:i + 64].flatten(), reduction="sum").item()
                    for i in range(0, m, 64))
    result = {"peer": "nanoGPT (hasten's rendering)", "seed": args.seed, "val_loss": total / y.numel(),
              "timed_s": timed, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "threads": torch.get_num_threads(), "torch": torch.__version__, "nanogpt_evals": log}
    print(json.dumps({k: v for k, v in result.items() if k != "nanogpt_evals"}))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
