"""Chunked cross-entropy: the LM head and the loss, computed a chunk of tokens at a time.

A language model's last layer makes (tokens x vocabulary) logits; the usual loss upcasts
them to float32 and keeps them for the backward pass: 12 x 1024 tokens of GPT-2 (vocabulary
50,304) is 2.5 GB. `chunked_cross_entropy(hidden, weight, targets, chunk_size)` never holds
more than one chunk of logits: the forward keeps only each token's log-sum-exp, and the
backward recomputes each chunk's logits to form `softmax - one_hot` and the gradients for
the hidden states and the head weight. Same numbers as the plain loss (float32 softmax),
a fraction of the memory, for the price of one extra head matmul.

It pays when vocabulary x tokens is large (BPE vocabularies); with a character vocabulary
(65) it saves nothing. The Algorithm makes the model return its final hidden states
(`output_hidden = True`, supported by hasten's GPT and the Hugging Face adapter) and uses
the chunked loss with the model's `lm_head` weight, in training and evaluation.
"""
from __future__ import annotations

import torch

from ..core import Algorithm
from ..registry import register_algorithm


class _ChunkedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size):
        n = hidden.shape[0]
        w = weight.to(hidden.dtype)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        picked = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for s in range(0, n, chunk_size):
            logits = (hidden[s:s + chunk_size] @ w.T).float()
            lse[s:s + chunk_size] = torch.logsumexp(logits, dim=-1)
            picked[s:s + chunk_size] = logits.gather(1, targets[s:s + chunk_size, None]).squeeze(1)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk_size = chunk_size
        return lse - picked

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, targets, lse = ctx.saved_tensors
        w = weight.to(hidden.dtype)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        cs = ctx.chunk_size
        for s in range(0, hidden.shape[0], cs):
            h = hidden[s:s + cs]
            p = torch.exp((h @ w.T).float() - lse[s:s + cs, None])          # softmax, float32
            p.scatter_add_(1, targets[s:s + cs, None], torch.full_like(p[:, :1], -1.0))
            p.mul_(grad_out[s:s + cs, None])
            if grad_h is not None:
                grad_h[s:s + cs] = (p.to(hidden.dtype) @ w).to(hidden.dtype)
            if grad_w is not None:
                grad_w += p.T @ h.float()
        return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None), None, None


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk_size: int = 4096) -> torch.Tensor:
    """Per-token cross-entropy of `hidden @ weight.T` against `targets`, chunk by chunk.

    hidden: (N, C) or (B, T, C); weight: (V, C); targets: matching (N,) or (B, T).
    Returns the per-token losses, flattened to (N,).
    """
    if hidden.dim() > 2:
        hidden = hidden.reshape(-1, hidden.shape[-1])
    return _ChunkedCE.apply(hidden, weight, targets.reshape(-1), int(chunk_size))


@register_algorithm("chunked_cross_entropy")
class ChunkedCrossEntropy(Algorithm):
    def fsdp_refusal(self):
        return ("it multiplies the output head's weight outside the model's forward, where FSDP keeps it "
                "sharded; drop it under parallelism=fsdp (or use ddp)")

    def __init__(self, chunk_size: int = 4096, head: str = "lm_head"):
        self.chunk_size, self.head = int(chunk_size), head

    def init(self, state, logger):
        model = state.model
        if not hasattr(model, "output_hidden"):
            raise ValueError("chunked cross-entropy needs a model that can return its final hidden states "
                             "(an `output_hidden` attribute, as hasten's GPT and HFCausalLM have)")
        head = model.get_submodule(self.head)
        if getattr(head, "bias", None) is not None:
            raise ValueError(f"{self.head} has a bias; the chunked loss supports bias-free heads only")
        model.output_hidden = True

        def loss_fn(hidden, targets):
            return chunked_cross_entropy(hidden, head.weight, targets, self.chunk_size)
        loss_fn.takes_hidden = True   # the model's outputs are hidden states: wrappers that need logits refuse
        state.loss_fn = loss_fn


__all__ = ["chunked_cross_entropy", "ChunkedCrossEntropy"]
