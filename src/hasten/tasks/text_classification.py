"""Text classification with a BERT-style encoder (fine-tuning): labelled documents, one
[CLS] + the document's first `block_size - 1` tokens each, padded with [PAD]; metrics val/acc
and val/f1 (macro-averaged over the classes).

Data: a `.jsonl(.gz)` of labelled texts (`text_field`, `label_field`), `spam` for the
SpamAssassin corpus of the project's data folder. The split, fixed and stated: every record of
a folder in `val_folders` goes to validation (the SpamAssassin recipe holds out the hard ham
there), and of the rest those whose `id_field` hashes (SHA-1) into the lowest `val_fraction`
(by index when the field is absent). E-mail headers: `headers: subject` keeps the Subject line
and the body, `drop` the body only, `keep` all.

The tokenizer is a BERT tokenizer of the pre-training corpus (`tokenizer_source`, the same
`vocab_size`: the masked_lm task's cached BPE with [MASK], [CLS], [PAD]) or `tokenizer_file`,
so a pre-trained checkpoint's embeddings mean the same tokens: start from one with
`trainer.load_path=RUN_OR_CHECKPOINT trainer.load_mode=weights` (the encoder's weights load,
the head starts fresh). The model: hasten's BertClassifier or `hf/KIND` (a transformers
sequence classifier).
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Optional

import torch

from ..data.corpus import corpus_tokenizer, read_documents, split_documents
from ..data.download import DatasetNotFoundError
from ..data.loaders import TensorPairs, make_dataloader
from ..errors import ConfigError, DataError
from ..metrics import accuracy, f1
from ..models.bert import BertClassifier, BertConfig
from ..registry import register_task
from ..schema import from_dict, setting
from .base import Built, NamedModel, Quality, TaskSpec, build_named, digest_problem, hf_model_section
from .masked_lm import SPECIALS


@dataclass
class DataConfig:
    source: str = "spam"
    """Labelled texts: spam (the SpamAssassin corpus), or a .jsonl(.gz) file."""
    text_field: str = "text"
    """The field that holds each record's text."""
    label_field: str = "label"
    """The field that holds its label: a class name or a whole number, one kind in a corpus."""
    classes: Optional[list[str]] = None
    """The class names in the model's output order; default the labels found, sorted. Recorded by the run when it starts, so an evaluation maps labels by the same list (labels it does not hold are refused)."""
    id_field: str = "id"
    """The field the split hashes (by index when absent)."""
    folder_field: str = "folder"
    """The field val_folders names."""
    val_folders: list[str] = field(default_factory=list)
    """Every record of these folders goes to validation."""
    val_fraction: float = setting(0.2, gt=0, lt=1)
    """Of the rest, the share held out for validation (by hash of id_field)."""
    headers: Literal["keep", "subject", "drop"] = "subject"
    """E-mail headers: keep all, keep the Subject line only, or drop them; texts that are not recognisably e-mails (a block of header lines naming From, Subject, Received... then a blank line) are left as they are."""
    tokenizer_source: str = "prose"
    """The pre-training corpus whose BERT tokenizer to use (with vocab_size and tokenizer_val_every as it was trained)."""
    tokenizer_val_every: int = setting(10, ge=2)
    """The pre-training corpus's held-out rule (the tokenizer is trained on its training documents)."""
    vocab_size: int = setting(8192, ge=256)
    """The tokenizer's vocabulary."""
    tokenizer_file: Optional[str] = None
    """A tokenizer.json of your own instead (with [CLS] and [PAD])."""
    tokenizer_sha256: Optional[str] = setting(None, check=digest_problem)
    """Recorded by the run when it starts (leave it unset): the SHA-256 of the tokenizer it trains with; a resume, an evaluation or a compression that would build another (the corpus changed) is refused."""
    block_size: int = setting(128, ge=8)
    """Tokens per text: [CLS] and the first block_size - 1."""
    batch_size: int = setting(32, ge=1)
    """Texts per training batch."""
    eval_batch_size: int = setting(128, ge=1)
    """Texts per evaluation batch."""


@dataclass
class ModelConfig(BertConfig):
    name: Literal["bert_classifier"] = "bert_classifier"
    """hasten's BertClassifier (hasten.models.bert), or hf/KIND for a transformers sequence classifier."""
    pool: Literal["first", "mean"] = "first"
    """The state the head reads: the first token's ([CLS]) or the mean of the tokens that are not padding."""


def model_config(raw: dict) -> "ModelConfig | NamedModel":
    return hf_model_section(raw) or from_dict(ModelConfig, raw or {}, "model")


def _labelled_source(source: str) -> str:
    if source != "spam":
        return source
    env = os.environ.get("HASTEN_SPAM")
    if env:
        return env
    for parent in Path(__file__).resolve().parents:
        p = parent.parent / "shared" / "data" / "spam-assassin.jsonl.gz"
        if p.is_file():
            return str(p)
    raise DatasetNotFoundError("the SpamAssassin corpus (spam-assassin.jsonl.gz) is not here: set HASTEN_SPAM to its "
                               "path, or give data.source a .jsonl(.gz) of labelled texts")


_HEADER_END = re.compile(r"\r?\n\r?\n")
_HEADER_LINE = re.compile(r"^([!-9;-~]+):")
# header fields every e-mail has some of: what makes a text recognisably an e-mail
EMAIL_HEADERS = frozenset({"from", "to", "cc", "subject", "date", "received", "return-path", "message-id",
                           "delivered-to", "reply-to", "sender", "mime-version", "content-type", "x-mailer",
                           "in-reply-to", "references", "envelope-to", "x-original-to"})


def is_email(text: str) -> bool:
    """A text that is recognisably an e-mail: a block of header lines (`Name: value`, or a
    continuation line starting with white space) naming at least two e-mail header fields
    (From, Subject, Received, ...), then a blank line. `Review: ...`, `Q: ...` or a URL on the
    first line are not."""
    parts = _HEADER_END.split(text, maxsplit=1)
    if len(parts) < 2:
        return False
    names = []
    for line in parts[0].splitlines():
        m = _HEADER_LINE.match(line)
        if m:
            names.append(m.group(1).lower())
        elif not line[:1].isspace() or not names:   # neither a header nor the continuation of one
            return False
    return len({n for n in names if n in EMAIL_HEADERS}) >= 2


def strip_headers(text: str, how: str) -> str:
    """An e-mail's text with its headers kept, cut to the Subject line, or dropped; any text
    that is not recognisably an e-mail (is_email) is returned as it is."""
    if how == "keep" or not is_email(text):
        return text
    head, body = _HEADER_END.split(text, maxsplit=1)
    if how == "drop":
        return body
    subject = next((ln for ln in head.splitlines() if ln.lower().startswith("subject:")), "")
    return f"{subject}\n\n{body}" if subject else body


def class_names(docs, d: DataConfig) -> list[str]:
    """The class list: data.classes when the run recorded it (every label must be one of them),
    else the labels found, sorted. Labels are class names or whole numbers, one kind in a
    corpus; names that differ only by case or white space are refused, not made two classes."""
    labels = []
    for i, doc in enumerate(docs):
        v = doc.meta.get(d.label_field)
        if v is None or isinstance(v, (bool, float, dict, list)) or isinstance(v, str) and not v.strip():
            raise DataError(f"{d.source}: record {i + 1} has label {v!r}; a label is a class name or a whole number")
        labels.append(v)
    kinds = {type(v) for v in labels}
    if len(kinds) > 1:
        first = {k: next(v for v in labels if type(v) is k) for k in kinds}
        raise DataError(f"{d.source}: labels are of more than one kind ({', '.join(repr(v) for v in first.values())}); "
                        "give every record's label as a name, or every one as a whole number")
    found = sorted({str(v) for v in labels})
    alike: dict[str, list[str]] = {}
    for name in found:
        alike.setdefault(" ".join(name.split()).casefold(), []).append(name)
    clash = next((names for names in alike.values() if len(names) > 1), None)
    if clash:
        raise DataError(f"{d.source}: labels {', '.join(repr(n) for n in clash)} differ only by case or white space; "
                        "make them one label in the data (they would be separate classes)")
    if d.classes is not None:
        unknown = sorted(set(found) - set(d.classes))
        if unknown:
            raise DataError(f"{d.source}: label(s) {', '.join(repr(u) for u in unknown[:5])} are not among the classes "
                            f"this run recorded ({', '.join(d.classes[:10])}); evaluate on data with those labels")
        return list(d.classes)
    return found


def split_labelled(docs, d: DataConfig) -> tuple[list, list]:
    """(training, validation) by the stated rule (module docstring)."""
    train, val = [], []
    cut = int(d.val_fraction * 2**32)
    for i, doc in enumerate(docs):
        if d.val_folders and doc.meta.get(d.folder_field) in d.val_folders:
            val.append(doc)
            continue
        key = str(doc.meta.get(d.id_field, i)).encode()
        (val if int.from_bytes(hashlib.sha1(key).digest()[:4], "big") < cut else train).append(doc)
    if d.val_folders:
        present = {doc.meta.get(d.folder_field) for doc in docs}
        unknown = [f for f in d.val_folders if f not in present]
        if unknown:
            raise DataError(f"{d.source}: data.val_folders names {', '.join(repr(f) for f in unknown)}, which no record's "
                            f"{d.folder_field!r} holds (it holds {', '.join(sorted(map(str, present - {None})))[:200]})")
    if not train or not val:
        raise DataError(f"{d.source}: the split left {len(train)} training and {len(val)} validation texts")
    return train, val


def build(recipe, runtime) -> Built:
    d: DataConfig = recipe.data
    docs = read_documents(_labelled_source(d.source), d.text_field)
    missing = [i for i, doc in enumerate(docs) if d.label_field not in doc.meta]
    if missing:
        raise DataError(f"{d.source}: record {missing[0] + 1} has no label field {d.label_field!r}; set data.label_field")
    classes = class_names(docs, d)
    if len(classes) < 2:
        raise DataError(f"{d.source}: one label only ({classes}); classification needs two or more")
    if d.tokenizer_file:
        tok = corpus_tokenizer([], d.vocab_size, d.tokenizer_file)
    else:
        pretrain = read_documents(d.tokenizer_source)
        tok = corpus_tokenizer(split_documents(pretrain, d.tokenizer_val_every)[0], d.vocab_size, None, SPECIALS)
    cls_id, pad_id = tok.token_id("[CLS]"), tok.token_id("[PAD]")
    train_docs, val_docs = split_labelled(docs, d)
    unseen = sorted({str(doc.meta[d.label_field]) for doc in val_docs} - {str(doc.meta[d.label_field]) for doc in train_docs})
    if unseen and d.classes is None:
        raise DataError(f"{d.source}: class(es) {', '.join(repr(u) for u in unseen[:5])} occur only in validation; the "
                        "model cannot learn them: change the split (data.val_folders, data.val_fraction) or the labels")

    def tensors(part, which):
        texts = [strip_headers(doc.text, d.headers) for doc in part]
        empty = sum(1 for x in texts if not x.strip())
        if empty * 2 > len(texts):
            raise DataError(f"{d.source}: {empty} of the {len(texts)} {which} texts are empty after data.headers="
                            f"{d.headers}; check data.text_field ({d.text_field!r}), or set data.headers=keep")
        ids = tok.encode_batch(texts)
        x = torch.full((len(part), d.block_size), pad_id, dtype=torch.long)
        for i, seq in enumerate(ids):
            seq = [cls_id, *seq[: d.block_size - 1]]
            x[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        y = torch.tensor([classes.index(str(doc.meta[d.label_field])) for doc in part], dtype=torch.long)
        return x, y

    (tx, ty), (vx, vy) = tensors(train_docs, "training"), tensors(val_docs, "validation")
    m = recipe.model
    if isinstance(m, NamedModel):   # a transformers sequence classifier or a user's module
        model = build_named("sequence_classification", m,
                            {"vocab_size": tok.vocab_size, "num_labels": len(classes), "pad_token_id": pad_id,
                             "pad_id": pad_id},
                            {"vocab_size": tok.vocab_size, "num_classes": len(classes), "pad_id": pad_id,
                             "block_size": d.block_size})
    else:
        try:
            cfg = BertConfig(**{k: v for k, v in vars(replace(m, vocab_size=tok.vocab_size,
                                                               block_size=max(m.block_size, d.block_size))).items()
                                if k not in ("name", "pool")})
        except ValueError as e:
            raise ConfigError(f"model: {e}") from e
        model = BertClassifier(cfg, num_classes=len(classes), pool=m.pool, pad_id=pad_id)
    seed = runtime.seed
    return Built(
        model=model,
        train_dataloader=make_dataloader(TensorPairs(tx, ty), d.batch_size, shuffle=True, seed=seed, num_workers=0),
        eval_dataloader=make_dataloader(TensorPairs(vx, vy), d.eval_batch_size, shuffle=False, seed=seed, num_workers=0),
        metrics={"acc": accuracy(len(classes)), "f1": f1(len(classes))},
        info={"params": sum(p.numel() for p in model.parameters()), "classes": classes,
              "train_texts": len(train_docs), "val_texts": len(val_docs), "tokenizer": tok})


SPEC = register_task(TaskSpec(
    name="text_classification", description="labelled texts classified by a BERT-style encoder (fine-tuning)",
    data_config=DataConfig, model_config=ModelConfig, parse_model=model_config, build=build,
    quality=Quality("val/acc", "max"), logs=("val/loss", "val/acc", "val/f1")))
