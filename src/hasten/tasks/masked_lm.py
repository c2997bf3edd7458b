"""Masked-language-model pre-training (BERT): windows of a corpus's documents, tokens masked on
the fly (hasten.data.masking: `mask_rate` of them, of which 80% become [MASK], 10% a random
token, 10% stay), the loss over the masked positions only (the Trainer's reduction divides by
the targets that count), validation masked with a fixed seed. Metrics: val/loss (nats per
masked token) and val/acc (masked tokens predicted right).

The tokenizer is the corpus's byte-level BPE with [MASK], [CLS] and [PAD] among its special
tokens (the same one text_classification uses to fine-tune, found in the same cache). The
model: hasten's BERT (`model: {name: bert, ...}`) or any `transformers` masked LM
(`model: {name: hf/bert, hidden_size: 256, ...}`).

`source` may also name a prepared source (`hasten data prepare`; a local folder or an
object-store URL): its windows are streamed and masked per window, from the sample's own seed.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Optional

from torch.utils.data import Subset

from ..data.corpus import EOD, tokenized_corpus
from ..data.loaders import make_dataloader
from ..data.masking import MaskedEvalWindows, MaskedWindows
from ..data.streaming import MaskPairs, StreamOptions, StreamTokens, is_stream, load_tokenizer, open_source, splits
from ..errors import ConfigError, DataError
from ..metrics import masked_accuracy
from ..models.bert import BERT, BertConfig
from ..registry import register_task
from ..schema import from_dict, setting
from .base import Built, NamedModel, Quality, TaskSpec, build_named, digest_problem, hf_model_section

SPECIALS = (EOD, "[MASK]", "[CLS]", "[PAD]")   # a BERT tokenizer's special tokens (masked_lm and text_classification)


@dataclass
class DataConfig(StreamOptions):
    source: str = "prose"
    """The corpus: prose, a .txt, a folder or archive of .txt, a .jsonl(.gz), or URL#sha256=HEX."""
    text_field: str = "text"
    """With .jsonl: the field that holds each document's text."""
    val_every: int = setting(10, ge=2)
    """Every val_every-th document (in file order) is held out for validation."""
    vocab_size: int = setting(8192, ge=256)
    """The BPE vocabulary to train on the training documents (the model's follows)."""
    tokenizer_file: Optional[str] = None
    """A tokenizer.json of your own (it must have [MASK], [CLS], [PAD] and <|endoftext|>)."""
    tokenizer_sha256: Optional[str] = setting(None, check=digest_problem)
    """Recorded by the run when it starts (leave it unset): the SHA-256 of the tokenizer it trains with; a resume, an evaluation or a compression that would build another (the corpus changed) is refused."""
    block_size: int = setting(128, ge=8)
    """Tokens per window."""
    batch_size: int = setting(32, ge=1)
    """Windows per training batch."""
    eval_batch_size: int = setting(64, ge=1)
    """Windows per evaluation batch."""
    eval_tokens: Optional[int] = setting(None, ge=1)
    """Evaluate on the first N validation tokens (default: all)."""
    num_workers: Optional[int] = setting(None, ge=0)
    """A prepared source: DataLoader worker processes (default cores - 1); other sources are windows in memory."""
    mask_rate: float = setting(0.15, gt=0, lt=1)
    """The share of tokens chosen for prediction (BERT: 0.15)."""
    mask_share: float = setting(0.8, ge=0, le=1)
    """Of the chosen, the share replaced by [MASK] (BERT: 0.8)."""
    random_share: float = setting(0.1, ge=0, le=1)
    """Of the chosen, the share replaced by a random token (BERT: 0.1); the rest stay as they are."""
    eval_mask_rate: Optional[float] = setting(None, gt=0, lt=1)
    """The validation's masking rate (default: mask_rate; give 0.15 to compare recipes that train at other rates)."""
    document_mask: bool = False
    """Attention stays inside each document of a packed window."""


@dataclass
class ModelConfig(BertConfig):
    name: Literal["bert"] = "bert"
    """The model: hasten's BERT (hasten.models.bert), or hf/KIND for a transformers masked LM."""


def model_config(raw: dict) -> "ModelConfig | NamedModel":
    return hf_model_section(raw) or from_dict(ModelConfig, raw or {}, "model")


def build(recipe, runtime) -> Built:
    d: DataConfig = recipe.data
    if d.mask_share + d.random_share > 1.0:
        raise ConfigError(f"data.mask_share + data.random_share = {d.mask_share + d.random_share} exceeds 1")
    streamed = is_stream(d.source)
    if streamed:
        manifest = open_source(d.source, "tokens", "data.source", d)
        tok = load_tokenizer(d.source, manifest)
    else:
        c = tokenized_corpus(d.source, d.text_field, d.val_every, d.vocab_size, d.tokenizer_file, SPECIALS)
        tok = c.tokenizer
    specials = tuple(tok.token_id(t) for t in SPECIALS)
    mask = dict(rate=d.mask_rate, mask_id=tok.token_id("[MASK]"), vocab_size=tok.vocab_size,
                mask_share=d.mask_share, random_share=d.random_share, special_ids=specials)
    if streamed:
        return _build_stream(recipe, runtime, manifest, tok, mask)
    val, val_seg = c.val_tokens, c.val_segments
    if d.eval_tokens:
        val, val_seg = val[:d.eval_tokens], val_seg[:d.eval_tokens]
    for split, n in (("training", len(c.train_tokens)), ("validation", len(val))):
        if n <= d.block_size:
            raise DataError(f"{d.source}: the {split} split has {n} tokens, too few for windows of {d.block_size} "
                            "(data.block_size)")
    model = _model(recipe.model, tok, d.block_size)
    train_seg, eval_seg = (c.train_segments, val_seg) if d.document_mask else (None, None)
    eval_mask = {**mask, "rate": d.eval_mask_rate or d.mask_rate}
    return Built(
        model=model,
        train_dataloader=MaskedWindows(c.train_tokens, d.block_size, d.batch_size, mask, seed=runtime.seed,
                                       segments=train_seg),
        eval_dataloader=MaskedEvalWindows(val, d.block_size, d.eval_batch_size, eval_mask, segments=eval_seg),
        metrics={"acc": masked_accuracy()},
        info={"params": sum(p.numel() for p in model.parameters()), "vocab_size": tok.vocab_size,
              "train_tokens": len(c.train_tokens), "val_tokens": len(val), "documents": c.documents, "tokenizer": tok})


def _model(m, tok, block_size: int):
    if isinstance(m, NamedModel):   # a transformers masked LM or a user's module
        return build_named("masked_lm", m, {"vocab_size": tok.vocab_size},
                           {"vocab_size": tok.vocab_size, "block_size": block_size})
    try:
        cfg = BertConfig(**{k: v for k, v in vars(replace(m, vocab_size=tok.vocab_size,
                                                           block_size=max(m.block_size, block_size))).items()
                            if k != "name"})
    except ValueError as e:
        raise ConfigError(f"model: {e}") from e
    return BERT(cfg)


def _build_stream(recipe, runtime, manifest: dict, tok, mask: dict) -> Built:
    """A prepared token source, streamed: windows masked per sample (hasten.data.streaming.MaskPairs)."""
    d: DataConfig = recipe.data
    train_split, eval_split = splits(d.source, manifest, d, ("train", "eval"))
    train_set = StreamTokens(train_split, d.block_size, segments=d.document_mask)
    eval_set = StreamTokens(eval_split, d.block_size, segments=d.document_mask)
    if d.eval_tokens:
        eval_set = Subset(eval_set, range(min(len(eval_set), max(1, d.eval_tokens // d.block_size))))
    model = _model(recipe.model, tok, d.block_size)
    seed = runtime.seed
    eval_mask = {**mask, "rate": d.eval_mask_rate or d.mask_rate}
    return Built(
        model=model,
        train_dataloader=make_dataloader(train_set, d.batch_size, shuffle=True, seed=seed, transform=MaskPairs(mask),
                                         num_workers=d.num_workers, blocks=train_split.blocks),
        eval_dataloader=make_dataloader(eval_set, d.eval_batch_size, shuffle=False, seed=seed + 1,
                                        transform=MaskPairs(eval_mask), num_workers=d.num_workers),
        metrics={"acc": masked_accuracy()},
        info={"params": sum(p.numel() for p in model.parameters()), "vocab_size": tok.vocab_size,
              "train_windows": len(train_set), "eval_windows": len(eval_set), "source": d.source, "tokenizer": tok})


SPEC = register_task(TaskSpec(
    name="masked_lm", description="masked-language-model pre-training (BERT) on a corpus of documents",
    data_config=DataConfig, model_config=ModelConfig, parse_model=model_config, build=build,
    quality=Quality("val/loss", "min"), logs=("val/loss", "val/acc"),
    compress_refusal=None))
