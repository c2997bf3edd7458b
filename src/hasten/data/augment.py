"""Batch augmentations that run on the training device, for whole (N, C, H, W) batches.

Every function takes its random numbers from an explicit `torch.Generator` on the batch's
device, uses no data-dependent control flow and no host synchronisation, and keeps the
batch's dtype and memory format (channels-last in, channels-last out). They are the
building blocks of `DeviceLoader` and usable in any loop:

    g = torch.Generator(device=x.device).manual_seed(0)
    x = hf.random_translate(x, 2, g)        # reflect-padded random crop back to size
    x = hf.random_flip(x, g)
    x = hf.cutout(x, 8, g)
    x = hf.random_brightness_contrast(x, 0.1, 0.1, g)   # on normalised images
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _like(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return out.contiguous(memory_format=torch.channels_last)
    return out


def normalize(x: torch.Tensor, mean, std, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 (N, C, H, W) -> `dtype`, (x - mean) / std per channel (mean, std in 0..255 units)."""
    mean = torch.as_tensor(mean, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    std = torch.as_tensor(std, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    return ((x.float() - mean) / std).to(dtype)


def _reflect(i: torch.Tensor, n: int) -> torch.Tensor:
    """Reflect indices into [0, n) the way F.pad(mode='reflect') does (edge not repeated)."""
    i = torch.where(i < 0, -i, i)
    return torch.where(i >= n, 2 * (n - 1) - i, i)


def translate(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, pad: int, mode: str = "reflect",
              flip: torch.Tensor | None = None) -> torch.Tensor:
    """Shift image i by (dy[i], dx[i]) pixels in [-pad, pad], filling from a `mode` padding;
    with a bool vector `flip`, also mirror the flagged images left-right.

    Equivalent to padding by `pad` and cropping back at offset (pad + dy, pad + dx). With
    reflect padding it is two gathers with reflected indices (any dtype, uint8 included, and
    the flip folded into the column index); other modes pad first. No loop over images, no
    host round trip.
    """
    n, c, h, w = x.shape
    if mode == "reflect" and pad >= min(h, w):
        raise ValueError(f"translate: a reflection of {pad} px needs images larger than that (these are {h}x{w}); "
                         f"give a smaller pad, or mode='constant' or 'replicate'")
    rows = torch.arange(h, device=x.device).view(1, h) + dy.view(n, 1)
    cols = torch.arange(w, device=x.device).view(1, w) + dx.view(n, 1)
    if mode == "reflect":
        src, rows, cols = x, _reflect(rows, h), _reflect(cols, w)
    else:
        src, rows, cols = F.pad(x, (pad, pad, pad, pad), mode=mode), rows + pad, cols + pad
    if flip is not None:
        cols = torch.where(flip.view(n, 1), cols.flip(1), cols)
    out = torch.gather(src, 2, rows.view(n, 1, h, 1).expand(n, c, h, src.shape[3]))
    out = torch.gather(out, 3, cols.view(n, 1, 1, w).expand(n, c, h, w))
    return _like(x, out)


def random_translate(x: torch.Tensor, pad: int, generator: torch.Generator | None = None,
                     mode: str = "reflect") -> torch.Tensor:
    """Random crop of the `pad`-padded image back to its size (uniform offsets, per image)."""
    if pad <= 0:
        return x
    d = torch.randint(-pad, pad + 1, (2, x.shape[0]), device=x.device, generator=generator)
    return translate(x, d[0], d[1], pad, mode)


def flip_where(x: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Flip left-right the images whose entry in the bool vector `flip` is True."""
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)


def random_flip(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Flip each image left-right with probability 1/2."""
    flip = torch.randint(0, 2, (x.shape[0],), device=x.device, generator=generator).bool()
    return flip_where(x, flip)


def alternating_flip(x: torch.Tensor, indices: torch.Tensor, epoch: int, first: torch.Tensor) -> torch.Tensor:
    """Alternating flip: sample i is flipped in epoch e when `first[i] XOR (e odd)`.

    `first` is one random bit per sample of the dataset, drawn once: every image is seen
    flipped and unflipped in alternate epochs instead of at random, which removes repeats.
    """
    flip = first[indices] ^ bool(epoch % 2)
    return flip_where(x, flip)


def cutout_centres(n: int, h: int, w: int, generator: torch.Generator | None = None,
                   device: "torch.device | str" = "cpu") -> torch.Tensor:
    """Random cutout centres of `n` images of `h` x `w`: a (2, n) tensor of rows and columns."""
    cy = torch.randint(0, h, (n,), device=device, generator=generator)
    cx = torch.randint(0, w, (n,), device=device, generator=generator)
    return torch.stack([cy, cx])


def cutout(x: torch.Tensor, size: int, generator: torch.Generator | None = None,
           centres: torch.Tensor | None = None) -> torch.Tensor:
    """Zero a `size` x `size` square at a random centre of each image (clipped at the borders);
    `centres` (from `cutout_centres`) gives them instead of drawing."""
    if size <= 0:
        return x
    n, _, h, w = x.shape
    if centres is None:
        centres = cutout_centres(n, h, w, generator, x.device)
    cy, cx = centres[0].view(n, 1, 1, 1), centres[1].view(n, 1, 1, 1)
    ys = torch.arange(h, device=x.device).view(1, 1, h, 1)
    xs = torch.arange(w, device=x.device).view(1, 1, 1, w)
    lo = size // 2
    inside = (ys >= cy - lo) & (ys < cy - lo + size) & (xs >= cx - lo) & (xs < cx - lo + size)
    return _like(x, x.masked_fill(inside, 0))


def brightness_contrast_factors(n: int, brightness: float, contrast: float, generator: torch.Generator | None = None,
                                device: "torch.device | str" = "cpu") -> torch.Tensor:
    """Per-image factors for `brightness_contrast`: a (2, n) float32 tensor of shifts, uniform in
    [-brightness, brightness], and scales, uniform in [1 - contrast, 1 + contrast]."""
    u = torch.rand(2, n, device=device, generator=generator) * 2 - 1
    return torch.stack([u[0] * brightness, 1 + u[1] * contrast])


def brightness_contrast(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Image i becomes (x[i] + shift[i]) * scale[i], every channel alike.

    Meant for normalised images (zero mean, unit variance per channel over the data set): the
    shift is then in units of the channels' standard deviation and the scale stretches the
    contrast about the data set's mean colour. Done in float32, returned in x's dtype."""
    n = x.shape[0]
    out = (x.float() + shift.view(n, 1, 1, 1)) * scale.view(n, 1, 1, 1)
    return _like(x, out.to(x.dtype))


def random_brightness_contrast(x: torch.Tensor, brightness: float, contrast: float,
                               generator: torch.Generator | None = None) -> torch.Tensor:
    """Random per-image brightness shift in [-brightness, brightness] and contrast scale in
    [1 - contrast, 1 + contrast] of a normalised batch (`brightness_contrast`)."""
    check_jitter(brightness, contrast)
    if not brightness and not contrast:
        return x
    f = brightness_contrast_factors(x.shape[0], brightness, contrast, generator, x.device)
    return brightness_contrast(x, f[0], f[1])


def check_jitter(brightness: float, contrast: float) -> None:
    if not brightness >= 0:
        raise ValueError(f"brightness (the largest shift, in standard deviations) must be >= 0, got {brightness}")
    if not 0 <= contrast < 1:
        raise ValueError(f"contrast (the largest relative change of contrast) must lie in [0, 1), got {contrast}")
