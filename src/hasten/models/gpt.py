"""A GPT in one readable module.

Causal self-attention through `scaled_dot_product_attention`; learned or rotary positions;
optional QK-norm; GELU, ReLU-squared or gated (SwiGLU, GEGLU) MLP; tied or untied embeddings;
output projections initialised small (GPT-2 style) or at zero. `flops_per_token` gives the
training FLOPs per token (forward and backward) for throughput and MFU.

Documents packed into one window can be kept apart: `forward(idx, segments)` with each
token's document number attends only within its document (block-causal; `attention_mask`
builds the mask). The attention and blocks take `causal=False` for encoders (hasten.models.bert).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..schema import setting


@dataclass
class GPTConfig:
    vocab_size: int = setting(65, ge=1)
    """Vocabulary size (set from the tokenizer for character and byte text)."""
    block_size: int = setting(64, ge=1)
    """Longest context (at least the data's block sizes)."""
    n_layer: int = setting(4, ge=1)
    """Transformer blocks."""
    n_head: int = setting(4, ge=1)
    """Attention heads (n_embd must divide by it)."""
    n_embd: int = setting(128, ge=1)
    """Width of the residual stream."""
    dropout: float = setting(0.0, ge=0, lt=1)
    """Dropout probability."""
    bias: bool = False
    """Biases in Linear and LayerNorm layers."""
    pos: Literal["learned", "rope"] = "learned"
    """Learned position embeddings or rotary positions."""
    qk_norm: bool = False
    """Normalise queries and keys before attention."""
    mlp: Literal["gelu", "relu2", "swiglu", "geglu"] = "gelu"
    """MLP activation: GELU, ReLU squared, or gated: SiLU or GELU of one half times the other."""
    mlp_ratio: int = setting(4, ge=1)
    """MLP hidden width as a multiple of n_embd."""
    mlp_hidden: Optional[int] = setting(None, ge=1)
    """MLP hidden width in units (default: mlp_ratio * n_embd); set by structured pruning."""
    head_dim: Optional[int] = setting(None, ge=1)
    """Width of one attention head (default: n_embd // n_head); structured pruning of heads
    keeps it and lowers n_head."""
    tie_embeddings: bool = True
    """Share the token embedding and the output head."""
    zero_init_proj: bool = False
    """Initialise output projections at zero (else GPT-2 style small)."""

    def __post_init__(self):
        if self.head_dim is None and self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.pos == "rope" and self.attn_head_dim % 2:
            raise ValueError("rotary positions need an even head size")

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    @property
    def hidden(self) -> int:
        return self.mlp_hidden or self.mlp_ratio * self.n_embd


def rope_tables(block_size: int, head_dim: int, base: float = 10000.0):
    """(cos, sin) of shape (block_size, head_dim) for `apply_rope`: the angle of position t and
    frequency i (i < head_dim / 2) at columns i and i + head_dim / 2, the sine negated in the
    first half, so that rotating each pair (x_i, x_{i+d/2}) is two products and a roll."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(block_size, dtype=torch.float32), inv)
    return torch.cat([freqs.cos(), freqs.cos()], -1), torch.cat([-freqs.sin(), freqs.sin()], -1)


def apply_rope(x, cos, sin):
    """Rotary positions on x (B, H, T, D): each pair (x_i, x_{i+D/2}) turned by its position's
    angle, written as x * cos + roll(x, D/2) * sin with the tables of `rope_tables`. The roll
    puts x_{i+D/2} against x_i (and x_i against x_{i+D/2}); one product and sum for the whole
    head instead of slicing into halves and concatenating them (1.63 ms against 2.14 ms a layer
    over the layer without positions, forward and backward of a 24 x 64-token batch, 4 heads of
    32, on a 2-core Xeon without bf16 hardware: benchmarks/probes/rope_cost.py)."""
    T = x.shape[-2]
    cos, sin = cos[:T].to(x.dtype), sin[:T].to(x.dtype)
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


def attention_mask(segments: torch.Tensor | None, T: int, causal: bool, pad: torch.Tensor | None = None,
                   device=None) -> torch.Tensor | None:
    """A boolean mask (B, 1, T, T) for `scaled_dot_product_attention` (True: may attend): within
    the same segment (document), causal or not, never onto padding (`pad` True where padded).
    None when nothing needs masking beyond plain causality (the fast path)."""
    if segments is None and pad is None:
        return None
    keep = None
    if segments is not None:
        keep = segments[:, :, None] == segments[:, None, :]
    if pad is not None:
        ok = ~pad[:, None, :]
        keep = ok if keep is None else keep & ok
        keep = keep | torch.eye(T, dtype=torch.bool, device=pad.device)   # a padded row attends to itself: no NaN
    if causal:
        keep = keep & torch.ones(T, T, dtype=torch.bool, device=keep.device).tril()
    return keep[:, None]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, causal: bool = True):
        super().__init__()
        self.n_head, self.head_dim, self.dropout = cfg.n_head, cfg.attn_head_dim, cfg.dropout
        self.causal = causal
        inner = cfg.n_head * self.head_dim   # n_embd unless heads were pruned
        self.qkv = nn.Linear(cfg.n_embd, 3 * inner, bias=cfg.bias)
        self.proj = nn.Linear(inner, cfg.n_embd, bias=cfg.bias)
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.qk_norm = cfg.qk_norm
        if cfg.pos == "rope":
            cos, sin = rope_tables(cfg.block_size, self.head_dim)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        else:
            self.rope_cos = None

    def forward(self, x, mask: torch.Tensor | None = None):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.qk_norm:
            q, k = F.rms_norm(q, (self.head_dim,)), F.rms_norm(k, (self.head_dim,))
        if self.rope_cos is not None:
            q, k = apply_rope(q, self.rope_cos, self.rope_sin), apply_rope(k, self.rope_cos, self.rope_sin)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal and mask is None,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.kind = cfg.mlp
        gated = cfg.mlp in ("swiglu", "geglu")
        self.fc = nn.Linear(cfg.n_embd, cfg.hidden * (2 if gated else 1), bias=cfg.bias)
        self.proj = nn.Linear(cfg.hidden, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        h = self.fc(x)
        if self.kind == "relu2":
            h = F.relu(h).square()
        elif self.kind == "gelu":
            h = F.gelu(h)
        else:
            a, b = h.chunk(2, dim=-1)
            h = (F.silu(a) if self.kind == "swiglu" else F.gelu(a)) * b
        return self.drop(self.proj(h))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, causal: bool = True):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, causal)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x, mask: torch.Tensor | None = None):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig | None = None, **kwargs):
        super().__init__()
        cfg = cfg or GPTConfig(**kwargs)
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.pos == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.output_hidden = False   # True: forward returns the final hidden states (chunked loss)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                if cfg.zero_init_proj:
                    nn.init.zeros_(p)
                else:
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def fsdp_blocks(self) -> list[nn.Module]:
        """The units sharded together under FSDP: the transformer blocks (hasten.distributed.fsdp)."""
        return list(self.blocks)

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.wpe is not None:
            n -= self.wpe.weight.numel()
        return n

    @property
    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 per parameter plus attention (PaLM appendix B)."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_embd * c.block_size

    def forward(self, idx: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, vocab) of token ids `idx` (B, T); with `segments` (B, T) each token's
        document number, attention stays within documents."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        x = self.drop(x)
        mask = attention_mask(segments, T, causal=True)
        for block in self.blocks:
            x = block(x, mask)
        x = self.ln_f(x)
        return x if self.output_hidden else self.lm_head(x)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.config.block_size:])[:, -1, :] / max(temperature, 1e-6)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
