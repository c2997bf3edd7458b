"""Language modelling with the GPT of hasten.models.gpt: character- or byte-level text,
byte-level BPE over a corpus of documents (`tokenizer: bpe`: the BPE trained on the training
documents and cached, or `tokenizer_file`; split by document, every `val_every`-th to
validation; `document_mask` keeps attention inside each document), or pre-tokenised token
files (`tokenizer: none` with `train_file`/`val_file`, e.g. GPT-2 BPE ids as nanoGPT's
prepare scripts write them). Registered as tasks `char_lm` and `lm`. Metrics: val/loss (nats
per token) and, with BPE, val/bpb (bits per byte of text: tokenizers compare).

`source` may also name a prepared source (`hasten data prepare`, a local folder or an object-store
URL such as s3://bucket/prose): its token windows are streamed shard by shard in a shard-local
order that resumes exactly (hasten.data.streaming)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Optional

from torch.utils.data import Subset

from ..data.corpus import BPE, token_bytes, tokenized_corpus
from ..data.loaders import make_dataloader
from ..data.streaming import StreamOptions, StreamTokens, is_stream, load_tokenizer, open_source, splits
from ..data.text import (ByteTokenizer, CharTokenizer, EvalWindows, RandomWindows, check_token_range, compact_dtype,
                         load_text, load_token_file, split_tokens)
from ..errors import ConfigError, DataError
from ..metrics import bits_per_byte
from ..models.gpt import GPT, GPTConfig
from ..schema import from_dict, setting
from ..registry import register_task
from .base import Built, NamedModel, Quality, TaskSpec, build_named, digest_problem, hf_model_section, user_loaders


@dataclass
class DataConfig(StreamOptions):
    source: str = "tinyshakespeare"
    """A packaged corpus or a text file (char, byte); for bpe: prose, a .txt, a folder or archive of .txt, a .jsonl(.gz), URL#sha256=HEX, or a prepared source (a folder or s3://... URL from hasten data prepare)."""
    tokenizer: Literal["char", "byte", "bpe", "none"] = "char"
    """char: one token per character; byte: UTF-8 bytes; bpe: byte-level BPE over documents; none: pre-tokenised train_file / val_file."""
    vocab_size: int = setting(8192, ge=256)
    """bpe: the vocabulary to train (the model's vocab_size follows)."""
    tokenizer_file: Optional[str] = None
    """bpe: a tokenizer.json of your own instead of training one."""
    tokenizer_sha256: Optional[str] = setting(None, check=digest_problem)
    """Recorded by the run when it starts (leave it unset): the SHA-256 of the tokenizer it trains with; a resume, an evaluation or a compression that would build another (the corpus changed) is refused."""
    text_field: str = "text"
    """bpe with .jsonl: the field that holds each document's text."""
    val_every: int = setting(10, ge=2)
    """bpe: every val_every-th document (in file order) is held out for validation."""
    document_mask: bool = False
    """bpe: attention stays inside each document of a packed window (block-causal)."""
    factory: Optional[str] = None
    """Your own data instead: `module:function` returning (train, eval) datasets or loaders of (tokens, next tokens) (hasten.tasks.base.user_loaders); needs model.vocab_size."""
    factory_args: dict[str, Any] = field(default_factory=dict)
    """factory: its keyword arguments."""
    train_file: Optional[str] = None
    """Flat token-id file for training (tokenizer: none)."""
    val_file: Optional[str] = None
    """Flat token-id file for validation (tokenizer: none)."""
    token_dtype: Literal["uint8", "uint16", "int16", "uint32", "int32", "int64"] = "uint16"
    """The token files' integer type (uint16 for GPT-2's vocabulary)."""
    eval_tokens: Optional[int] = setting(None, ge=1)
    """Evaluate on the first N validation tokens (default: all)."""
    block_size: int = setting(64, ge=1)
    """Context length of training windows."""
    batch_size: int = setting(12, ge=1)
    """Windows per training batch."""
    eval_block_size: Optional[int] = setting(None, ge=1)
    """Context length of evaluation windows; default: block_size."""
    eval_batch_size: int = setting(64, ge=1)
    """Windows per evaluation batch."""
    num_workers: Optional[int] = setting(None, ge=0)
    """A prepared source: DataLoader worker processes (default cores - 1); other sources are windows in memory."""
    train_fraction: float = setting(0.9, gt=0, lt=1)
    """The first fraction of the text is the training split, the rest validation."""


@dataclass
class ModelConfig(GPTConfig):
    name: Literal["gpt"] = "gpt"
    """The model: hasten's GPT (hasten.models.gpt)."""


def model_config(raw: dict) -> "ModelConfig | NamedModel":
    return hf_model_section(raw) or from_dict(ModelConfig, raw or {}, "model")


def _tokens(d: DataConfig):
    if d.tokenizer == "bpe":
        c = tokenized_corpus(d.source, d.text_field, d.val_every, d.vocab_size, d.tokenizer_file)
        segments = (c.train_segments, c.val_segments) if d.document_mask else (None, None)
        return c.train_tokens, c.val_tokens, c.tokenizer, segments
    if d.document_mask:
        raise ConfigError("data.document_mask needs documents: data.tokenizer=bpe over a corpus of documents")
    if d.tokenizer == "none":
        if not (d.train_file and d.val_file):
            raise ConfigError("data.tokenizer=none needs data.train_file and data.val_file (flat token-id files)")
        return load_token_file(d.train_file, d.token_dtype), load_token_file(d.val_file, d.token_dtype), None, (None, None)
    text = load_text(d.source)
    tok = CharTokenizer(text) if d.tokenizer == "char" else ByteTokenizer()
    train, val = split_tokens(tok.encode(text, compact_dtype(tok.vocab_size)), d.train_fraction)   # windows: int64
    return train, val, tok, (None, None)


def _build_factory(recipe, runtime) -> Built:
    d: DataConfig = recipe.data
    m = recipe.model
    vocab = m.args.get("vocab_size") if isinstance(m, NamedModel) else m.vocab_size
    if isinstance(m, NamedModel):
        if vocab is None:
            raise ConfigError(f"data.factory: give model.vocab_size (the vocabulary {d.factory}'s tokens come from)")
        model = build_named("causal_lm", m, {"vocab_size": vocab}, {"vocab_size": vocab, "block_size": d.block_size})
    else:
        try:
            model = GPT(GPTConfig(**{k: v for k, v in vars(replace(m, block_size=max(m.block_size, d.block_size))).items()
                                     if k != "name"}))
        except ValueError as e:
            raise ConfigError(f"model: {e}") from e
    train, val, _ = user_loaders(d.factory, d.factory_args, d.batch_size, d.eval_batch_size, runtime.seed)
    return Built(model=model, train_dataloader=train, eval_dataloader=val,
                 info={"data": d.factory, "vocab_size": vocab, "params": sum(p.numel() for p in model.parameters())})


def _build_stream(recipe, runtime) -> Built:
    """A prepared token source, streamed (hasten.data.streaming)."""
    d: DataConfig = recipe.data
    if d.tokenizer != "bpe":
        raise ConfigError(f"data.source={d.source} is a prepared source, already tokenized with its BPE: set "
                          f"data.tokenizer=bpe (not {d.tokenizer})")
    manifest = open_source(d.source, "tokens", "data.source", d)
    tok = load_tokenizer(d.source, manifest)
    train_split, eval_split = splits(d.source, manifest, d, ("train", "eval"))
    eval_block = d.eval_block_size or d.block_size
    train_set = StreamTokens(train_split, d.block_size, segments=d.document_mask)
    eval_set = StreamTokens(eval_split, eval_block, segments=d.document_mask)
    if d.eval_tokens:
        eval_set = Subset(eval_set, range(min(len(eval_set), max(1, d.eval_tokens // eval_block))))
    m = recipe.model
    if isinstance(m, NamedModel):
        model = build_named("causal_lm", m, {"vocab_size": tok.vocab_size},
                            {"vocab_size": tok.vocab_size, "block_size": max(d.block_size, eval_block)})
        params = sum(p.numel() for p in model.parameters())
    else:
        m = replace(m, vocab_size=tok.vocab_size, block_size=max(m.block_size, d.block_size, eval_block))
        try:
            model = GPT(GPTConfig(**{k: v for k, v in vars(m).items() if k != "name"}))
        except ValueError as e:
            raise ConfigError(f"model: {e}") from e
        params = model.num_params()
    seed = runtime.seed
    return Built(
        model=model,
        train_dataloader=make_dataloader(train_set, d.batch_size, shuffle=True, seed=seed, num_workers=d.num_workers,
                                         blocks=train_split.blocks),
        eval_dataloader=make_dataloader(eval_set, d.eval_batch_size, shuffle=False, seed=seed,
                                        num_workers=d.num_workers),
        metrics={"bpb": bits_per_byte(token_bytes(tok))},
        info={"params": params, "vocab_size": tok.vocab_size, "train_windows": len(train_set),
              "eval_windows": len(eval_set), "source": d.source, "tokenizer": tok})


def build(recipe, runtime) -> Built:
    d: DataConfig = recipe.data
    if d.factory:
        return _build_factory(recipe, runtime)
    if is_stream(d.source):
        return _build_stream(recipe, runtime)
    train, val, tok, (train_seg, val_seg) = _tokens(d)
    if d.eval_tokens:
        val = val[:d.eval_tokens + 1]
        val_seg = None if val_seg is None else val_seg[:d.eval_tokens + 1]
    m = recipe.model
    eval_block = d.eval_block_size or d.block_size
    where = d.source if d.tokenizer != "none" else f"{d.train_file} / {d.val_file}"
    for split, tokens, block, key in (("training", train, d.block_size, "data.block_size"),
                                      ("validation", val, eval_block, "data.eval_block_size")):
        if len(tokens) < block + 1:
            raise DataError(f"{where}: the {split} split has {len(tokens)} tokens, too few for windows of "
                            f"{block} ({key}); give more text or a smaller {key}")
    if isinstance(m, NamedModel):   # a transformers causal LM or a user's module
        vocab = tok.vocab_size if tok is not None else m.args.get("vocab_size")
        if vocab is None:
            raise ConfigError(f"model: {m.name} on token files needs model.vocab_size")
        model = build_named("causal_lm", m, {"vocab_size": vocab},
                            {"vocab_size": vocab, "block_size": max(d.block_size, eval_block)})
        params = sum(p.numel() for p in model.parameters())
        return _built(model, params, vocab, d, runtime, train, val, tok, train_seg, val_seg, eval_block)
    block = max(d.block_size, eval_block)
    if m.block_size < block:
        m = replace(m, block_size=block)
    if tok is not None and m.vocab_size != tok.vocab_size:
        m = replace(m, vocab_size=tok.vocab_size)
    if tok is None:   # token files: every id must index the model's embedding
        for split, tokens, path in (("training", train, d.train_file), ("validation", val, d.val_file)):
            check_token_range(tokens, m.vocab_size, path, "model.vocab_size")
    try:
        cfg = GPTConfig(**{k: v for k, v in vars(m).items() if k != "name"})
    except ValueError as e:
        raise ConfigError(f"model: {e}") from e
    model = GPT(cfg)
    return _built(model, model.num_params(), cfg.vocab_size, d, runtime, train, val, tok, train_seg, val_seg, eval_block)


def _built(model, params, vocab_size, d, runtime, train, val, tok, train_seg, val_seg, eval_block) -> Built:
    return Built(
        model=model,
        train_dataloader=RandomWindows(train, d.block_size, d.batch_size, seed=runtime.seed, segments=train_seg),
        eval_dataloader=EvalWindows(val, eval_block, d.eval_batch_size, segments=val_seg),
        metrics={"bpb": bits_per_byte(token_bytes(tok))} if isinstance(tok, BPE) else {},
        info={"params": params, "vocab_size": vocab_size, "train_tokens": len(train),
              "val_tokens": len(val), "tokenizer": tok})


SPEC = register_task(TaskSpec(
    name="char_lm", aliases=("lm",), description="language modelling with hasten's GPT (characters, bytes or token files)",
    data_config=DataConfig, model_config=ModelConfig, parse_model=model_config, build=build,
    quality=Quality("val/loss", "min"), logs=("val/loss", "val/bpb")))
