"""Patch whitening: set the first convolution from data so its outputs are white.

The k x k patches of a sample of training images are centred and their covariance
C = V diag(l) V^T is computed; the first conv gets the filters V^T / sqrt(l + eps) (and, with
`negate=True`, their negatives too, so a ReLU-like activation after it keeps both signs) and
the bias that centres the outputs. On the patches it was fitted on, the conv's (positive)
outputs then have identity covariance. The filters are frozen: the layer costs nothing to
train, and the network starts from decorrelated inputs (the stem of the fast CIFAR-10 line
of work).

Functional form: `fit_patch_whitening(conv, images, eps)`. The Algorithm fits at INIT from
up to `num_images` training images and reports the time as method set-up.
"""
from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core import Algorithm, Time
from ..registry import register_algorithm


def patch_covariance(images: torch.Tensor, kernel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (d,) and covariance (d, d) of all k x k patches of `images` (N, C, H, W), d = C*k*k."""
    patches = F.unfold(images.float(), kernel).transpose(1, 2).reshape(-1, images.shape[1] * kernel * kernel)
    mean = patches.mean(0)
    centred = (patches - mean).double()
    return mean, (centred.T @ centred / len(centred)).float()


def covariance_eigh(cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues and eigenvectors (columns) of the patch covariance, in float64 on the CPU:
    a d x d problem (d = 12 for 2x2 RGB patches), and on a GPU the solver's first call in a
    process costs far more than the work (library set-up)."""
    return torch.linalg.eigh(cov.double().cpu())


def whitening_filters(mean: torch.Tensor, evals: torch.Tensor, evecs: torch.Tensor, eps: float,
                      negate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The whitening conv's filters (rows, on `mean`'s device) and the bias that centres the
    patches: V^T / sqrt(l + eps) and minus the filtered mean; with `negate`, each followed by
    its negative."""
    filters = (evecs.T / torch.sqrt(evals.clamp_min(0) + eps).unsqueeze(1)).float().to(mean.device)
    bias = -(filters @ mean)
    if negate:
        filters, bias = torch.cat([filters, -filters]), torch.cat([bias, -bias])
    return filters, bias


@torch.no_grad()
def fit_patch_whitening(conv: nn.Conv2d, images: torch.Tensor, eps: float = 5e-4, negate: bool = True) -> None:
    """Set `conv`'s filters (and bias) to whiten the `k x k` patches of `images` (N, C, H, W): filters
    are the eigenvectors of the patch covariance scaled by 1 / sqrt(eigenvalue + eps), the bias
    removes the patch mean; with `negate` each filter is followed by its negative (2 C k^2 output
    channels). The conv must be square, ungrouped and stride 1."""
    k = conv.kernel_size[0]
    if conv.kernel_size[0] != conv.kernel_size[1] or conv.groups != 1 or conv.stride != (1, 1):
        raise ValueError("patch whitening needs a square, ungrouped, stride-1 convolution")
    d = conv.in_channels * k * k
    want = 2 * d if negate else d
    if conv.out_channels != want:
        raise ValueError(f"a whitening conv on {conv.in_channels} channels with kernel {k} needs "
                         f"{want} output channels (negate={negate}); it has {conv.out_channels}")
    mean, cov = patch_covariance(images, k)
    evals, evecs = covariance_eigh(cov)
    filters, bias = whitening_filters(mean, evals, evecs, eps, negate)
    conv.weight.copy_(filters.view(want, conv.in_channels, k, k))
    if conv.bias is not None:
        conv.bias.copy_(bias)
    elif mean.abs().max() > 1e-3:
        raise ValueError("the whitening conv has no bias, so it cannot centre the patches")


def _sample_images(loader, n: int) -> torch.Tensor:
    """Up to n normalised training images: straight from a DeviceLoader, else from batches."""
    if hasattr(loader, "images") and hasattr(loader, "mean"):
        x = loader.images[:n]
        return (x.float() - loader.mean) / loader.std
    got, count = [], 0
    for batch in loader:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        got.append(x)
        count += len(x)
        if count >= n:
            break
    return torch.cat(got)[:n]


def first_conv(model: nn.Module) -> nn.Conv2d:
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            return m
    raise ValueError("the model has no Conv2d to whiten")


@register_algorithm("patch_whitening")
class PatchWhitening(Algorithm):
    """Fit the first conv (or `module`) at init; `freeze` keeps its filters fixed afterwards;
    `train_bias_for` (a typed time such as '3ep' or '0.3dur') stops training its bias after
    that much of the run (None: the bias trains throughout).

    How the bias stops depends on what runs the forward pass:
    - hasten's Trainer running the model itself, uncompiled, in one process:
      `requires_grad_(False)`. The backward pass then ends at the first conv group: no
      gradient for that conv's input, the stem's activation or the bias (on a 2-core CPU the
      speedrun net's bf16 step at batch 2000 took 3% less time at 32 px and 8% less at 24 px,
      `benchmarks/probes/whiten_bias_stop.py`).
    - a compiled model, one wrapped for DDP or sharded by FSDP, or another trainer's loop
      (Lightning, the HF Trainer: `state.host`): the bias loses its gradient
      after every backward pass (the optimizer skips a parameter without one: no update, no
      momentum, no weight decay) and keeps `requires_grad`. The graph keeps its shape, so a
      compiled model compiles nothing new when the bias stops (a change of requires_grad is a
      guard that recompiles every shape) and DDP's wrapper sees the same parameters used at
      every step (no search for unused ones). The price is the backward work above.
    - compiled optimizer steps (`trainer.compile_optimizer`), whatever runs the forward: the
      bias keeps a gradient, zeroed after every backward pass, and its value is put back after
      every optimizer step. A compiled step guards on which parameters have gradients, so
      dropping one would compile the step again inside timed training; the zero gradient adds
      nothing to a global norm, and the put-back undoes what momentum and weight decay do to
      the bias (a copy of its few numbers a step).
    All give the same updates to every other parameter."""
    def __init__(self, num_images: int = 5000, eps: float = 5e-4, module: str | None = None, freeze: bool = True,
                 train_bias_for: str | None = None):
        self.num_images, self.eps, self.module, self.freeze = num_images, eps, module, freeze
        self.train_bias_for = Time.parse(train_bias_for) if train_bias_for is not None else None
        self._conv: nn.Conv2d | None = None
        self.bias_stopped = False
        self._held_bias: torch.Tensor | None = None   # compiled optimizer steps: the bias's value when it stopped

    def batch_start(self, state, logger):
        if (self.train_bias_for is not None and not self.bias_stopped and self._conv is not None
                and state.progress >= state.fraction_of(self.train_bias_for)):
            self.bias_stopped = True   # from the run's progress: a resumed run stops it again at its first batch
            if state.optimizer_compiled:
                self._held_bias = self._conv.bias.detach().clone()
            elif not self.keeps_graph(state):
                self._conv.bias.requires_grad_(False)
                self._conv.bias.grad = None

    @staticmethod
    def keeps_graph(state) -> bool:
        """Whether the bias must stop without changing requires_grad: unless hasten's Trainer runs
        the model itself, uncompiled, in one process, the forward pass may be compiled or
        distributed (DDP, FSDP, another trainer's loop), where that change recompiles or breaks
        the wrapper."""
        world = state.runtime.world if state.runtime is not None else None
        alone = (world is not None and not world.data_parallel
                 and not (torch.distributed.is_available() and torch.distributed.is_initialized()))
        return not (alone and state.host is None and state.forward_model is state.model)

    def after_backward(self, state, logger):
        if self.bias_stopped:
            bias = self._conv.bias
            if self._held_bias is None:
                bias.grad = None
            elif bias.grad is not None:
                bias.grad.zero_()

    def after_optim_step(self, state, logger):
        if self._held_bias is not None:
            with torch.no_grad():
                self._conv.bias.copy_(self._held_bias)

    def init(self, state, logger):
        t0 = time.perf_counter()
        conv = self._conv = state.model.get_submodule(self.module) if self.module else first_conv(state.model)
        images = _sample_images(state.train_dataloader, self.num_images).to(conv.weight.device)
        fit_patch_whitening(conv, images, self.eps, negate=conv.out_channels == 2 * conv.in_channels * conv.kernel_size[0] ** 2)
        if self.freeze:
            conv.weight.requires_grad_(False)
        state.method_seconds += time.perf_counter() - t0


__all__ = ["patch_covariance", "fit_patch_whitening", "PatchWhitening"]
