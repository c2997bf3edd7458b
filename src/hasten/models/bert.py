"""A BERT-style encoder: bidirectional transformer blocks (hasten.models.gpt's, pre-norm), a
masked-language-model head tied to the token embedding, and a classifier over the encoder.

`BERT(cfg)(idx, segments=None, pad=None)` gives MLM logits (B, T, vocab); `BertClassifier`
(the same encoder, a fresh head) gives class logits (B, classes) from the first token's state
(`pool: first`, BERT's [CLS]) or the mean over the tokens that are not padding (`pool: mean`).
A classifier's encoder loads a pre-trained BERT's weights by name (`encoder.*`), so a masked-LM
checkpoint starts a fine-tuning run (hasten.assembly: `load_path` of another model loads what
fits). `segments` keeps attention inside packed documents; `pad` (True at padding) keeps it off
padding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..schema import setting
from .gpt import Block, GPTConfig, attention_mask


@dataclass
class BertConfig:
    vocab_size: int = setting(8192, ge=1)
    """Vocabulary size (set from the tokenizer)."""
    block_size: int = setting(128, ge=1)
    """Longest sequence (learned positions)."""
    n_layer: int = setting(4, ge=1)
    """Transformer blocks."""
    n_head: int = setting(4, ge=1)
    """Attention heads."""
    n_embd: int = setting(256, ge=1)
    """Width."""
    mlp: Literal["gelu", "swiglu", "geglu"] = "gelu"
    """MLP: GELU (BERT), or gated (SwiGLU, GEGLU: the GLU variants later encoders use)."""
    mlp_hidden: Optional[int] = setting(None, ge=1)
    """MLP hidden width; default 4 x n_embd (GELU) or 8/3 x n_embd rounded to 64 (gated, the same parameters)."""
    head_dim: Optional[int] = setting(None, ge=1)
    """Width of one attention head (default n_embd // n_head); structured pruning of heads keeps it and lowers n_head."""
    dropout: float = setting(0.1, ge=0, lt=1)
    """Dropout probability (BERT: 0.1)."""
    bias: bool = True
    """Biases in Linear and LayerNorm layers (BERT has them)."""
    qk_norm: bool = False
    """Normalise queries and keys before attention."""

    def gpt(self) -> GPTConfig:
        """The blocks' settings, in the shape hasten's transformer blocks take."""
        hidden = self.mlp_hidden
        if hidden is None:
            hidden = 4 * self.n_embd if self.mlp == "gelu" else int(math.ceil(8 * self.n_embd / 3 / 64) * 64)
        return GPTConfig(vocab_size=self.vocab_size, block_size=self.block_size, n_layer=self.n_layer,
                         n_head=self.n_head, n_embd=self.n_embd, dropout=self.dropout, bias=self.bias,
                         mlp=self.mlp, mlp_hidden=hidden, qk_norm=self.qk_norm, head_dim=self.head_dim)


class Encoder(nn.Module):
    """Token and position embeddings, bidirectional blocks, a final norm: (B, T) ids -> (B, T, width)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        g = cfg.gpt()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.ln_e = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(g, causal=False) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)

    def forward(self, idx: torch.Tensor, segments: torch.Tensor | None = None,
                pad: torch.Tensor | None = None) -> torch.Tensor:
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        x = self.drop(self.ln_e(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))))
        mask = attention_mask(segments, T, causal=False, pad=pad)
        for block in self.blocks:
            x = block(x, mask)
        return self.ln_f(x)


def _init(module: nn.Module, n_layer: int) -> None:
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
    for name, p in module.named_parameters():
        if name.endswith("proj.weight"):
            nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))


class BERT(nn.Module):
    """The encoder and BERT's masked-LM head (dense, GELU, norm, decoder tied to the embedding)."""

    def __init__(self, cfg: BertConfig | None = None, **kwargs):
        super().__init__()
        cfg = cfg or BertConfig(**kwargs)
        self.config = cfg
        self.encoder = Encoder(cfg)
        self.mlm_dense = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.mlm_ln = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        _init(self, cfg.n_layer)

    def fsdp_blocks(self) -> list[nn.Module]:
        return list(self.encoder.blocks)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def flops_per_token(self) -> float:
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_embd * c.block_size

    def forward(self, idx: torch.Tensor, segments: torch.Tensor | None = None,
                pad: torch.Tensor | None = None) -> torch.Tensor:
        h = self.encoder(idx, segments, pad)
        h = self.mlm_ln(F.gelu(self.mlm_dense(h)))
        return F.linear(h, self.encoder.wte.weight, self.mlm_bias)


class BertClassifier(nn.Module):
    """The encoder (loads a BERT's `encoder.*` weights) and a linear head on a pooled state."""

    def __init__(self, cfg: BertConfig | None = None, num_classes: int = 2, pool: str = "first",
                 pad_id: int | None = None, **kwargs):
        super().__init__()
        if pool not in ("first", "mean"):
            raise ValueError(f"pool={pool!r}: use 'first' (the first token, BERT's [CLS]) or 'mean'")
        cfg = cfg or BertConfig(**kwargs)
        self.config, self.pool, self.pad_id = cfg, pool, pad_id
        self.encoder = Encoder(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(cfg.n_embd, num_classes)
        _init(self, cfg.n_layer)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        """Class logits (B, classes); `pad` (True at padding) defaults to the tokens equal to `pad_id`."""
        if pad is None and self.pad_id is not None:
            pad = idx == self.pad_id
        h = self.encoder(idx, pad=pad)
        if self.pool == "first":
            pooled = h[:, 0]
        else:
            keep = (~pad).unsqueeze(-1).to(h.dtype) if pad is not None else torch.ones_like(h[..., :1])
            pooled = (h * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        return self.head(self.drop(pooled))


__all__ = ["BERT", "BertClassifier", "BertConfig", "Encoder"]
