"""Hugging Face `transformers` models under the hasten Trainer, and from a recipe.

Each adapter gives a task its contract (inputs -> logits) and leaves the loss and its
reduction to the Trainer (the model's own `labels=` loss is not used):

- `HFCausalLM(model)`: token ids -> logits (B, T, V) (any `AutoModelForCausalLM`); with
  `output_hidden = True` the final hidden states (ChunkedCrossEntropy with `lm_head`);
- `HFMaskedLM(model)`: token ids (and `pad`) -> logits (B, T, V) (`AutoModelForMaskedLM`);
- `HFSequenceClassifier(model)`: token ids (padding from `pad_id`) -> logits (B, classes);
- `HFImageClassifier(model)`: images -> logits (B, classes) (`ViTForImageClassification`).

`logits_of(outputs)` reads the logits of a `ModelOutput`; `build_model(task_kind, name, **config)`
builds a randomly initialised model offline from a recipe's `model: {name: hf/KIND, ...}` (KIND
a `transformers` model type such as bert, gpt2, vit), and `load_pretrained_weights` reads a local
`save_pretrained` folder into one.

    pip install 'hasten[hf]'
    from transformers import GPT2Config, GPT2LMHeadModel
    model = HFCausalLM(GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=65)))
    Trainer(model, RandomWindows(tokens, 64, 12), ...).fit()

`HFCausalLM.from_config(kind, **config)` builds a randomly initialised model offline.

hasten's methods inside the Hugging Face Trainer: `HastenTrainer` and `muon_optimizer` (in
hasten.integrations.hf_trainer, importable from here).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import CheckpointError, ConfigError, first_line
from ..loss import logits_of  # noqa: F401  (re-exported: where model outputs are read)


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


class HFMaskedLM(nn.Module):
    """Token ids (and `pad`, True at padding) -> MLM logits (B, T, V) of an `AutoModelForMaskedLM`.
    `segments` (packed documents) is accepted and ignored: Hugging Face encoders attend across them."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, segments: torch.Tensor | None = None,
                pad: torch.Tensor | None = None) -> torch.Tensor:
        mask = None if pad is None else (~pad).long()
        return self.model(input_ids=idx, attention_mask=mask).logits


class HFSequenceClassifier(nn.Module):
    """Token ids -> class logits (B, C) of an `AutoModelForSequenceClassification`; padding
    (tokens equal to `pad_id`) is masked out of attention."""

    def __init__(self, model: nn.Module, pad_id: int | None = None):
        super().__init__()
        self.model, self.pad_id = model, pad_id

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        mask = None if self.pad_id is None else (idx != self.pad_id).long()
        return self.model(input_ids=idx, attention_mask=mask).logits


class HFImageClassifier(nn.Module):
    """Images (B, 3, H, W) -> class logits of a `ViTForImageClassification`-style model
    (other sizes than the config's: positions interpolated)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = getattr(self.model.config, "image_size", None)
        interpolate = size is not None and tuple(x.shape[-2:]) != (size, size)
        return self.model(pixel_values=x, interpolate_pos_encoding=interpolate).logits


KINDS = ("causal_lm", "masked_lm", "sequence_classification", "image_classification")


def build_model(kind: str, name: str, **config) -> nn.Module:
    """A randomly initialised `transformers` model of type `name` (bert, gpt2, vit, ...) for a
    task of `kind` (KINDS), wrapped in its adapter; a bad type or setting is a ValueError naming it."""
    t = _transformers()
    pad_id = config.pop("pad_id", None)
    try:
        default = t.AutoConfig.for_model(name)
    except ValueError as e:
        raise ConfigError(f"model.name hf/{name}: {str(e).splitlines()[0]}") from None
    known = (set(default.to_dict()) | set(t.PretrainedConfig().to_dict()) | set(getattr(default, "attribute_map", {}))
             | {"num_labels", "id2label", "label2id"})   # every config's, set through properties
    unknown = sorted(k for k in config if k not in known)
    if unknown:
        raise ConfigError(f"model: {unknown} are not settings of a transformers {type(default).__name__} (to switch a "
                          f"recipe's model to hf/{name}, give the whole section: 'model={{name: hf/{name}, ...}}'); its "
                          f"own settings: {sorted(set(default.to_dict()) - set(t.PretrainedConfig().to_dict()))[:16]}")
    cfg = t.AutoConfig.for_model(name, **config)
    if kind == "causal_lm":
        return HFCausalLM(t.AutoModelForCausalLM.from_config(cfg))
    if kind == "masked_lm":
        return HFMaskedLM(t.AutoModelForMaskedLM.from_config(cfg))
    if kind == "sequence_classification":
        return HFSequenceClassifier(t.AutoModelForSequenceClassification.from_config(cfg), pad_id)
    if kind == "image_classification":
        return HFImageClassifier(t.AutoModelForImageClassification.from_config(cfg))
    raise ConfigError(f"kind={kind!r}: use one of {KINDS}")


def __getattr__(name: str):
    """HastenTrainer and muon_optimizer live in hf_trainer (it subclasses transformers.Trainer,
    so importing it imports transformers): loaded when first asked for."""
    if name in ("HastenTrainer", "muon_optimizer"):
        from . import hf_trainer   # the optional extra (transformers, accelerate) off hasten's start-up
        return getattr(hf_trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_pretrained_folder(path) -> bool:
    """Whether `path` is a folder `save_pretrained` wrote (a config.json and weights)."""
    from pathlib import Path
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file() and (
        any(p.glob("*.safetensors")) or any(p.glob("pytorch_model*.bin")))


def load_pretrained_weights(adapter: nn.Module, folder, check=None) -> tuple[list[str], list[str], list[str]]:
    """Read a local `save_pretrained` folder's weights (safetensors; .bin only through
    weights-only loading) into the adapter's model, the tensors that fit by name and shape;
    returns (loaded, missing, unexpected). `check(names)` sees the names that fit before anything
    is copied, and may refuse. A damaged or refused file is a CheckpointError naming it."""
    from pathlib import Path
    folder = Path(folder)
    state = {}
    files = sorted(folder.glob("*.safetensors"))
    for f in files or sorted(folder.glob("pytorch_model*.bin")):
        state.update(_read_weights_file(f))
    mine = adapter.model.state_dict()
    fits = {k: v for k, v in state.items() if k in mine and v.shape == mine[k].shape}
    if check is not None:
        check(sorted(fits))
    adapter.model.load_state_dict(fits, strict=False)
    return sorted(fits), [k for k in mine if k not in fits], [k for k in state if k not in fits]


def _read_weights_file(f) -> dict:
    """The tensors of one weights file of a save_pretrained folder, or hasten's one line: a
    damaged safetensors file, or a .bin that weights-only loading refuses (hasten never loads
    one otherwise: a pickle can run code)."""
    if f.suffix == ".safetensors":
        from safetensors.torch import load_file   # ships with transformers
        try:
            return load_file(str(f))
        except Exception as e:   # SafetensorError (a damaged header), OSError, or a bad dtype
            raise CheckpointError(f"{f} is not a safetensors file that can be read ({first_line(e)[:120]}): it is "
                                  "damaged or incomplete; save or download the model again") from None
    try:
        loaded = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:   # an unpickler refusal, a truncated zip
        what = "holds objects other than tensors" if "weights_only" in str(e) or "Unpickl" in type(e).__name__ \
            else f"cannot be read ({first_line(e)[:100]})"
        raise CheckpointError(f"{f} {what}; hasten reads .bin weights only as tensors and never runs code from a "
                              "file: save the model as safetensors (save_pretrained(..., safe_serialization=True)) "
                              "from a copy you trust") from None
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise CheckpointError(f"{f} holds no mapping of names to tensors; it is not a model's weights")
    return loaded