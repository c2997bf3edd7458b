"""A vision transformer (Dosovitskiy et al., 2021; DeiT's recipe for training it without extra
data, Touvron et al., 2021): non-overlapping patches embedded by a strided convolution, learned
positions, pre-norm transformer blocks (hasten.models.gpt's, bidirectional), a norm, and a
linear head on the class token (`pool: cls`) or on the mean of the patch tokens (`pool: mean`).

Images of another size than `image_size` work: the position table is resized to the new patch
grid (bicubic), as DeiT does when fine-tuning at a higher resolution; so progressive resizing
(images at half size early: a quarter of the tokens, coarser patches of the full image) needs
no new model. `keep` (training only) drops a random share of the patch tokens before the
blocks (token dropping): fewer tokens, less compute, the same weights.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..registry import register_model
from .gpt import Block, GPTConfig


@register_model("vit")
class ViT(nn.Module):
    def __init__(self, image_size: int = 32, patch_size: int = 4, num_classes: int = 10, width: int = 192,
                 depth: int = 6, heads: int = 3, mlp_ratio: int = 4, dropout: float = 0.0, pool: str = "cls",
                 qk_norm: bool = False, mlp: str = "gelu"):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size={image_size} is not a multiple of patch_size={patch_size}")
        if pool not in ("cls", "mean"):
            raise ValueError(f"pool={pool!r}: use 'cls' or 'mean'")
        if width % heads:
            raise ValueError(f"width={width} must be divisible by heads={heads}")
        self.image_size, self.patch_size, self.pool = image_size, patch_size, pool
        self.grid = image_size // patch_size
        cfg = GPTConfig(vocab_size=1, block_size=self.grid ** 2 + 1, n_layer=depth, n_head=heads, n_embd=width,
                        dropout=dropout, bias=True, mlp=mlp, mlp_ratio=mlp_ratio, qk_norm=qk_norm)
        self.config = cfg
        self.patch = nn.Conv2d(3, width, patch_size, stride=patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.zeros(1, self.grid ** 2, width))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(cfg, causal=False) for _ in range(depth))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)
        self.keep = 1.0   # the share of patch tokens kept in training (token dropping sets it)
        nn.init.trunc_normal_(self.pos, std=0.02)
        nn.init.trunc_normal_(self.cls, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        nn.init.zeros_(self.head.weight)

    def fsdp_blocks(self) -> list[nn.Module]:
        return list(self.blocks)

    @property
    def flops_per_image(self) -> float:
        n, w = self.grid ** 2 + 1, self.config.n_embd
        params = sum(p.numel() for p in self.blocks.parameters())
        return 6 * (params * n + self.patch.weight.numel() * self.grid ** 2) + 12 * len(self.blocks) * w * n * n

    def _positions(self, grid_h: int, grid_w: int) -> torch.Tensor:
        if (grid_h, grid_w) == (self.grid, self.grid):
            return self.pos
        table = self.pos.reshape(1, self.grid, self.grid, -1).permute(0, 3, 1, 2)
        table = F.interpolate(table, size=(grid_h, grid_w), mode="bicubic", align_corners=False)
        return table.permute(0, 2, 3, 1).reshape(1, grid_h * grid_w, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x)                                  # (B, width, gh, gw)
        B, W, gh, gw = t.shape
        t = t.flatten(2).transpose(1, 2) + self._positions(gh, gw)
        if self.training and self.keep < 1.0:               # token dropping: a random share of patches
            n = t.shape[1]
            k = max(1, int(math.ceil(n * self.keep)))
            idx = torch.rand(B, n, device=t.device).argsort(dim=1)[:, :k]
            t = t.gather(1, idx.unsqueeze(-1).expand(-1, -1, W))
        if self.pool == "cls":
            t = torch.cat([self.cls.expand(B, -1, -1), t], dim=1)
        t = self.drop(t)
        for block in self.blocks:
            t = block(t)
        t = self.ln(t)
        pooled = t[:, 0] if self.pool == "cls" else t.mean(1)
        return self.head(pooled)


__all__ = ["ViT"]
