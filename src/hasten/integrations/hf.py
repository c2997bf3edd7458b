"""Hugging Face `transformers` causal language models under the hasten Trainer.

`HFCausalLM(model)` wraps any `AutoModelForCausalLM`-style model so that it takes token ids
and returns logits (B, T, V), the contract of hasten's language-model tasks and default
loss (per-token cross-entropy, reduced by the Trainer). With `output_hidden = True` it
returns the final hidden states instead (used by ChunkedCrossEntropy with `lm_head`).

    pip install 'hasten[hf]'
    from transformers import GPT2Config, GPT2LMHeadModel
    model = HFCausalLM(GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=65)))
    Trainer(model, RandomWindows(tokens, 64, 12), ...).fit()

`HFCausalLM.from_config(kind, **config)` builds a randomly initialised model offline.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError("the Hugging Face adapter needs transformers: pip install 'hasten[hf]'") from e
    return transformers


class HFCausalLM(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.output_hidden = False

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    @classmethod
    def from_config(cls, kind: str = "gpt2", **config) -> "HFCausalLM":
        t = _transformers()
        cfg = t.AutoConfig.for_model(kind, **config)
        return cls(t.AutoModelForCausalLM.from_config(cfg))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.output_hidden:
            out = self.model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
            return out.hidden_states[-1]
        return self.model(input_ids=input_ids, use_cache=False).logits
