"""`hasten data prepare`: a source written as Parquet shards with a manifest, for streaming
(hasten.data.streaming).

- Text (a packaged corpus such as `prose`, a .txt, a folder or archive of .txt, a .jsonl(.gz)):
  split by document (every `val_every`-th to validation), a BERT-style byte-level BPE trained on
  the training documents (the masked-LM specials among its tokens, so GPT and BERT recipes read
  the same source), the documents packed with an end-of-document token between them and cut into
  windows of `block_size + 1` tokens with each token's document number (`segments`); the
  tokenizer is written beside the shards.
- Images (`cifar10`, a CIFAR-10 archive, folder or image zip, or an ImageNet-style folder with
  train/ and val/): every image as raw uint8 HWC bytes with its shape and label (no codec to
  decode: no torchvision, no Pillow at training time).

Rows of the training split are shuffled once (by `seed`) before sharding, so that shard-local
reading is close to a global shuffle. Shards are about `shard_mb` MiB. The manifest is written
last: a destination without it is incomplete. The destination must be empty or hold a source
prepared with the same settings (then nothing is written); anything else is refused in one
line: prepare never writes over what it did not make.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

from ..callbacks.progress import work_progress
from ..errors import ConfigError, DataError
from ..files import atomic_write
from ..tasks.masked_lm import SPECIALS
from ..version import __version__
from .cifar import load_cifar10
from .corpus import EOD, corpus_tokenizer, encode_documents, pack, read_documents, split_documents
from .imagefolder import ImageFolder
from .streaming import FORMAT, MANIFEST, filesystem, manifest_problem, shards_digest

SPLITS = ("train", "eval")


def _settings(**kw) -> dict:
    return {k: v for k, v in kw.items() if v is not None}


def _check_destination(out: str, settings: dict) -> "dict | None":
    """The manifest of an identical earlier prepare at `out` (nothing to do), None for an empty or
    missing destination; a ConfigError for anything else."""
    fs, root = filesystem(out)
    root = root.rstrip("/")
    if not fs.exists(root):
        return None
    if not fs.isdir(root):
        raise ConfigError(f"--out {out} is a file; give a folder (or a prefix) for the prepared source")
    names = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
    if not names:
        return None
    if MANIFEST in names:
        try:
            with fs.open(f"{root}/{MANIFEST}", "rb") as f:
                manifest = json.loads(f.read(1 << 24))
        except (OSError, ValueError):
            manifest = None
        if manifest is not None and not manifest_problem(manifest):
            if manifest.get("settings") == settings:
                return manifest
            raise ConfigError(f"--out {out} holds a source prepared with other settings "
                              f"({_differs(manifest.get('settings') or {}, settings)}); choose another --out")
    raise ConfigError(f"--out {out} is not empty and holds no source hasten prepared ({', '.join(names[:3])}"
                      f"{'...' if len(names) > 3 else ''}); hasten data prepare writes only into an empty folder: "
                      "choose another --out")


def _differs(a: dict, b: dict) -> str:
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return "; ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:3]) or "settings"


def prepare(source: str, out: str, block_size: int = 256, vocab_size: int = 8192, val_every: int = 10,
            text_field: str = "text", shard_mb: float = 64.0, seed: int = 0, console=None) -> tuple[dict, bool]:
    """Write `source` as a prepared source at `out`; returns (its manifest, whether anything was
    written)."""
    if block_size < 8:
        raise ConfigError(f"--block-size {block_size}: give at least 8 tokens")
    if not shard_mb > 0:
        raise ConfigError(f"--shard-mb {shard_mb}: give a size in MiB > 0")
    kind = "images" if _is_image_source(source) else "tokens"
    settings = _settings(source=source, kind=kind, block_size=block_size if kind == "tokens" else None,
                         vocab_size=vocab_size if kind == "tokens" else None,
                         val_every=val_every if kind == "tokens" else None, seed=seed, shard_mb=shard_mb,
                         text_field=text_field if kind == "tokens" else None)
    done = _check_destination(out, settings)
    if done is not None:
        return done, False
    if kind == "tokens":
        splits, extra, files = _token_rows(source, block_size, vocab_size, val_every, text_field, seed)
    else:
        splits, extra, files = _image_rows(source, seed)
    manifest = {"format": FORMAT, "kind": kind, "splits": {}, **extra, "settings": settings,
                "made_by": {"hasten": __version__}}
    fs, root = filesystem(out)
    root = root.rstrip("/")
    fs.makedirs(root, exist_ok=True)
    for name, data in files.items():   # the tokenizer
        _put(fs, root, name, data)
    for split, table in splits.items():
        manifest["splits"][split] = {"rows": table.num_rows,
                                     "shards": _write_shards(fs, root, split, table, shard_mb, console)}
    manifest["digest"] = shards_digest(manifest["splits"])
    _put(fs, root, MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest, True


def _put(fs, root: str, name: str, data: bytes) -> None:
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        atomic_write(Path(root) / name, lambda f: f.write(data))
    else:
        with fs.open(f"{root}/{name}", "wb") as f:
            f.write(data)


def _write_shards(fs, root: str, split: str, table, shard_mb: float, console) -> list[dict]:
    import pyarrow.parquet as pq   # optional extra: stream
    console = console or Console(stderr=True, quiet=True)
    row_bytes = max(1, table.nbytes // max(1, table.num_rows))
    per_shard = max(1, int(shard_mb * (1 << 20)) // row_bytes)
    shards = []
    with tempfile.TemporaryDirectory(prefix="hasten-prepare-") as tmp, \
            work_progress(f"prepare {split}", console, BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
                          TimeRemainingColumn()) as progress:
        task = progress.add_task(split, total=table.num_rows)
        for i, start in enumerate(range(0, table.num_rows, per_shard)):
            part = table.slice(start, per_shard)
            name = f"{split}-{i:05d}.parquet"
            local = Path(tmp) / name
            pq.write_table(part, local, row_group_size=min(1024, per_shard), compression="zstd")
            data = local.read_bytes()
            _put(fs, root, name, data)
            shards.append({"name": name, "rows": part.num_rows, "bytes": len(data),
                           "sha256": hashlib.sha256(data).hexdigest()})
            local.unlink()
            progress.advance(task, part.num_rows)
    return shards


# ---------------------------------------------------------------------------- text
def _token_rows(source: str, block_size: int, vocab_size: int, val_every: int, text_field: str, seed: int):
    import pyarrow as pa   # optional extra: stream
    docs = read_documents(source, text_field)
    train_docs, val_docs = split_documents(docs, val_every)
    tok = corpus_tokenizer(train_docs, vocab_size, None, SPECIALS)
    eod = tok.token_id(EOD)
    splits = {}
    for split, part in (("train", train_docs), ("eval", val_docs)):
        tokens, segments = pack(encode_documents(tok, part), eod)
        n = (len(tokens) - 1) // block_size
        if n < 1:
            raise DataError(f"{source}: the {split} split has {len(tokens)} tokens, fewer than one window of "
                            f"{block_size} (--block-size)")
        starts = np.arange(n) * block_size
        if split == "train":
            starts = starts[np.random.default_rng(seed).permutation(n)]
        idx = starts[:, None] + np.arange(block_size + 1)
        windows = np.asarray(tokens)[idx].astype(np.int32)
        segs = np.asarray(segments)[idx[:, :-1]].astype(np.int64)
        segs = (segs - segs[:, :1]).astype(np.int32)   # each window's documents numbered from 0
        splits[split] = pa.table({"tokens": pa.FixedSizeListArray.from_arrays(windows.reshape(-1), block_size + 1),
                                  "segments": pa.FixedSizeListArray.from_arrays(segs.reshape(-1), block_size)})
    text = tok.tok.to_str().encode()
    extra = {"block_size": block_size, "vocab_size": tok.vocab_size, "tokenizer": "tokenizer.json",
             "tokenizer_sha256": tok.digest, "documents": {"train": len(train_docs), "eval": len(val_docs)}}
    return splits, extra, {"tokenizer.json": text}


# ---------------------------------------------------------------------------- images
def _is_image_source(source: str) -> bool:
    if source == "cifar10":
        return True
    p = Path(source).expanduser()
    if p.is_file() and p.name.endswith((".tar.gz", ".tgz")) and "cifar" in p.name.lower():
        return True
    if p.is_file() and p.suffix == ".zip":
        try:
            with zipfile.ZipFile(p) as z:
                return any(n.lower().endswith((".png", ".jpg", ".jpeg")) for n in z.namelist()[:50])
        except zipfile.BadZipFile:
            return False
    return p.is_dir() and ((p / "train").is_dir() or (p / "data_batch_1").is_file()
                           or (p / "cifar-10-batches-py").is_dir())


def _image_rows(source: str, seed: int):
    import pyarrow as pa   # optional extra: stream
    p = Path(source).expanduser()
    if source != "cifar10" and p.is_dir() and (p / "train").is_dir() and not (p / "data_batch_1").is_file():
        splits, classes = _folder_images(p)
    else:
        data = load_cifar10(None if source == "cifar10" else source)
        splits = {"train": (data.train_x.numpy(), data.train_y.numpy()),
                  "eval": (data.test_x.numpy(), data.test_y.numpy())}
        classes = list(data.classes)
    tables = {}
    for split, (images, labels) in splits.items():
        order = np.random.default_rng(seed).permutation(len(labels)) if split == "train" else np.arange(len(labels))
        rows_image = [np.ascontiguousarray(images[i]).tobytes() for i in order]
        rows_shape = [list(images[i].shape) for i in order]
        tables[split] = pa.table({"image": pa.array(rows_image, pa.binary()),
                                  "shape": pa.array(rows_shape, pa.list_(pa.int32())),
                                  "label": pa.array(np.asarray(labels)[order].astype(np.int64))})
    shapes = {tuple(s) for t in splits.values() for s in (im.shape for im in t[0][:1])}
    extra = {"classes": classes, "image_shape": list(next(iter(shapes))) if len(shapes) == 1 else None}
    return tables, extra, {}


def _folder_images(root: Path):
    out, classes = {}, None
    for split, sub in (("train", "train"), ("eval", "val")):
        ds = ImageFolder(root, sub, classes=classes)
        classes = ds.classes
        images = [np.asarray(ds[i][0], dtype=np.uint8) for i in range(len(ds))]
        labels = [label for _, label in ds.samples]
        out[split] = (images, labels)
    return out, classes


def describe(manifest: dict, out: str) -> str:
    """One line about a prepared source."""
    rows = ", ".join(f"{s}: {v['rows']:,} rows in {len(v['shards'])} shard(s)" for s, v in manifest["splits"].items())
    what = (f"windows of {manifest['block_size']} tokens, vocabulary {manifest['vocab_size']}"
            if manifest["kind"] == "tokens" else f"{len(manifest.get('classes') or [])} classes")
    return f"{out}: {manifest['kind']} ({what}); {rows}"


__all__ = ["describe", "prepare"]
