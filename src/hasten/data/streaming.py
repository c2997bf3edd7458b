"""Data that does not fit one machine: a prepared source read shard by shard from a folder or an
object store, in an order that resumes exactly.

A prepared source (written by `hasten data prepare`, hasten.data.prepare) is a folder, local or
at any fsspec URL (`s3://bucket/prefix`, `gs://`, `az://`...), holding Parquet shards of
fixed-form rows (token windows, or raw uint8 images with their labels) per split, and a
manifest, `hasten-stream.json`, that lists every shard with its rows, bytes and SHA-256, the
fields, the tokenizer or the classes, and what made it. Parquet is read with pyarrow and
object stores through fsspec (s3fs, gcsfs, adlfs): maintained libraries, no torchvision
(why not litdata or mosaicml-streaming: docs/streaming.md).

Reading: `StreamSplit(url, split)` is a map-style dataset over one split. A shard is read
whole when a row of it is first asked for: a local source in place, a remote one downloaded
once into a cache folder (`cache_dir`, never a home folder hasten did not name) whose size is
bounded (`cache_limit`): least recently used shards that hasten put there are removed first,
nothing else in the folder ever is. Every time a shard is decoded, the bytes decoded are first
checked against the manifest's size and SHA-256 (a download before it enters the cache, too):
a source that is not what its manifest says is refused in one line naming the shard. Every
file a manifest names is a plain name inside the source, and its digest is that of its
shards; a checkpoint records the manifest's identity (`data_identity`), so a resume on a
source prepared again is refused.

Order: `shard_local_order` (the `blocks` of hasten's ResumableSampler) draws, from (seed,
epoch) alone, a permutation of the shards, then of the rows inside each window of
`window` consecutive shards of it: reads stay local to a few shards at a time, the order does
not depend on the worker count or the world size, and a run resumed mid-epoch starts at its
position without reading what it skips (hasten.data.resumable). Under data parallelism each
rank loads its share of every global batch, as for any hasten loader.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import ConfigError, DataError, brief, first_line
from ..files import FolderLock, atomic_write
from ..microbatch import parse_bytes
from ..schema import setting
from .corpus import BPE, _tokenizers
from .download import data_root
from .imagefolder import _pil
from .masking import mask_tokens
from .resumable import SHARD_WINDOW, shard_local_order  # noqa: F401 (the order of a streamed source)

MANIFEST = "hasten-stream.json"
FORMAT = 1
REMOTE = ("s3://", "gs://", "gcs://", "az://", "abfs://", "abfss://", "hf://", "http://", "https://", "memory://")
CACHE_MARK = ".hasten-stream-cache.json"   # the cache folder's index: what hasten put there
_AGAIN = ("the source changed since it was prepared: restore it as prepared, or prepare it again "
          "(hasten data prepare) and start a new run")


@dataclasses.dataclass
class StreamOptions:
    """Where a streamed source's shards are cached, and how much they may take (the data
    section of every task that reads prepared sources has these keys)."""
    stream_cache: Optional[str] = None
    """A streamed source from an object store: the folder its downloaded shards go to (default HASTEN_DATA/stream-cache); a local source is read in place."""
    stream_cache_limit: str = setting("20GB", check=lambda v: _size_problem(v))
    """The most the downloaded shards may take on disk (e.g. 20GB); the least recently used are removed first."""


def _size_problem(value) -> "str | None":
    try:
        parse_bytes(value)
    except ConfigError as e:
        return "is not a size; " + str(e).split(": ", 1)[-1]
    return None


def is_remote(url: str) -> bool:
    return isinstance(url, str) and url.startswith(REMOTE)


def is_stream(source) -> bool:
    """Whether `source` names a prepared source: a URL of an object store, or a local folder
    holding a manifest. A URL with its file's checksum (`...#sha256=HEX`) names one file to
    download (a corpus), never a prepared source."""
    if not isinstance(source, str) or not source or "#sha256=" in source:
        return False
    return is_remote(source) or (Path(source).expanduser() / MANIFEST).is_file()


def filesystem(url: str):
    """(fsspec filesystem, path within it) for `url`. S3's endpoint, keys and region come from
    the standard AWS variables (AWS_ENDPOINT_URL for an S3-compatible server)."""
    try:
        import fsspec   # optional extra: stream
    except ImportError as e:   # pragma: no cover - fsspec comes with the stream extra
        raise ImportError("streamed sources need the stream extra: pip install 'hasten[stream]'") from e
    options = {}
    if url.startswith("s3://"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            options["client_kwargs"] = {"endpoint_url": endpoint}
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as e:
        scheme = url.split("://", 1)[0]
        raise ConfigError(f"{url}: reading {scheme}:// needs its fsspec package ({e.name or e}): pip install "
                          "'hasten[stream]' (s3fs), gcsfs or adlfs") from None
    return fs, path


def read_manifest(url: str) -> dict:
    """The manifest of the prepared source at `url`, checked; a DataError names what is wrong."""
    fs, root = filesystem(url)
    where = f"{url.rstrip('/')}/{MANIFEST}"
    try:
        with fs.open(f"{root.rstrip('/')}/{MANIFEST}", "rb") as f:
            data = json.loads(f.read(1 << 24))
    except FileNotFoundError:
        raise DataError(f"{url} holds no prepared source ({MANIFEST} is missing): make one with "
                        f"`hasten data prepare SOURCE --out {url}`") from None
    except (ValueError, RecursionError) as e:
        raise DataError(f"{where} is not a manifest hasten wrote ({type(e).__name__}); prepare the source again") from None
    except OSError as e:
        raise DataError(f"cannot read {where}: {e}") from None
    problem = manifest_problem(data)
    if problem:
        raise DataError(f"{where}: {problem}; prepare the source again")
    return data


FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
"""A file a manifest names (a shard, the tokenizer): a plain name inside the source folder, no
separator, no leading dot, so it cannot name a path outside the source."""
SHA256 = re.compile(r"[0-9a-f]{64}")


def shards_digest(splits: dict) -> str:
    """The digest a manifest records for its shards: the SHA-256 of their SHA-256s in manifest order."""
    return hashlib.sha256(json.dumps([s["sha256"] for sp in splits.values() for s in sp["shards"]]).encode()).hexdigest()


def manifest_problem(m) -> "str | None":
    """What keeps `m` from being a manifest of this format (None: nothing): every file it names
    is a plain name inside the source, every shard has rows, bytes and a SHA-256, and its digest
    is the digest of those SHA-256s."""
    if not isinstance(m, dict):
        return "not a mapping"
    if m.get("format") != FORMAT:
        return f"format {m.get('format')!r}, this hasten reads {FORMAT}"
    if m.get("kind") not in ("tokens", "images"):
        return f"kind {m.get('kind')!r} is not tokens or images"
    splits = m.get("splits")
    if not isinstance(splits, dict) or not splits:
        return "no splits"
    for name, split in splits.items():
        shards = split.get("shards") if isinstance(split, dict) else None
        if not isinstance(shards, list) or not shards:
            return f"split {name!r} lists no shards"
        for s in shards:
            if not (isinstance(s, dict) and isinstance(s.get("name"), str) and FILE_NAME.fullmatch(s["name"])):
                return (f"split {name!r} has a shard whose name is not a file name inside the source: "
                        f"{brief(s.get('name') if isinstance(s, dict) else s, 80)}")
            ok = (isinstance(s.get("rows"), int) and s["rows"] > 0 and isinstance(s.get("bytes"), int)
                  and s["bytes"] > 0 and isinstance(s.get("sha256"), str) and SHA256.fullmatch(s["sha256"]))
            if not ok:
                return f"split {name!r} has a shard entry that is not name/rows/bytes/sha256: {brief(s, 80)}"
    if m["kind"] == "tokens":
        tok = m.get("tokenizer")
        if not (isinstance(tok, str) and FILE_NAME.fullmatch(tok)):
            return f"its tokenizer {brief(tok, 80)} is not a file name inside the source"
        if not (isinstance(m.get("tokenizer_sha256"), str) and SHA256.fullmatch(m["tokenizer_sha256"])):
            return "it records no SHA-256 of its tokenizer"
    if m.get("digest") != shards_digest(splits):
        return "its digest is not the digest of the shards it lists (the manifest was edited)"
    return None


def manifest_identity(manifest: dict) -> str:
    """What a checkpoint records of the prepared source it trained on: the digest of its shards
    and of its tokenizer. A resume on a source with another identity is refused."""
    return hashlib.sha256(json.dumps([manifest["digest"], manifest.get("tokenizer_sha256")]).encode()).hexdigest()


class ShardCache:
    """The cache folder of remote shards: downloads under a lock, each checked against its
    SHA-256, and a size bound kept by removing the least recently used shards hasten put there
    (listed in the folder's own index, `CACHE_MARK`); nothing else in the folder is touched."""

    def __init__(self, folder: Path, limit: int):
        self.folder, self.limit = Path(folder), int(limit)

    def _index(self) -> dict:
        try:
            data = json.loads((self.folder / CACHE_MARK).read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, dict) and isinstance(v.get("bytes"), int)} \
            if isinstance(data, dict) else {}

    def _save(self, index: dict) -> None:
        atomic_write(self.folder / CACHE_MARK, lambda f: json.dump(index, f), binary=False)

    def read(self, fs, remote: str, name: str, size: int, sha256: str, where: "str | None" = None) -> bytes:
        """The bytes of shard `name`, proven by `sha256`: the cached copy when it is still the
        shard (a copy that is not, changed on disk since, is downloaded again: the index says it
        is hasten's), else downloaded from `remote` under the folder's lock and checked before
        it enters the cache (a shard changed in the store is refused). `where` names the shard in
        messages (its URL)."""
        where = where or remote
        local = self.folder / name
        index = self._index()
        if name in index and local.is_file() and local.stat().st_size == size:
            data = local.read_bytes()
            if hashlib.sha256(data).hexdigest() == sha256:
                index[name]["used"] = time.time()
                return data
        self.folder.mkdir(parents=True, exist_ok=True)
        lock = FolderLock(self.folder, "stream cache folder")
        for _ in range(600):   # another process (a loader worker) may be downloading: wait for it
            try:
                lock.acquire()
                break
            except Exception:
                time.sleep(0.1)
        else:
            raise DataError(f"the stream cache {self.folder} stayed locked for a minute; is another run stuck?")
        try:
            index = self._index()
            if name in index and local.is_file() and local.stat().st_size == size:
                data = local.read_bytes()
                if hashlib.sha256(data).hexdigest() == sha256:
                    return data   # another process downloaded it meanwhile
            if size > self.limit:
                raise DataError(f"shard {name} ({size >> 20} MiB) is larger than data.stream_cache_limit "
                                f"({self.limit >> 20} MiB); raise the limit")
            index.pop(name, None)
            self._evict(index, size)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=self.folder)
            os.close(fd)
            try:
                try:
                    fs.get_file(remote, tmp)
                except FileNotFoundError:
                    raise DataError(f"{where}: the shard is missing from the store (its manifest lists it); "
                                    "upload the whole source again, or prepare it again") from None
                data = Path(tmp).read_bytes()
                got = hashlib.sha256(data).hexdigest()
                if got != sha256:
                    raise DataError(f"{where}: its SHA-256 is {got[:12]}..., the manifest says {sha256[:12]}...: the "
                                    "shard changed in the store since it was prepared; restore it as prepared, or "
                                    "prepare the source again (hasten data prepare) and start a new run")
                os.replace(tmp, local)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            index[name] = {"bytes": size, "used": time.time()}
            self._save(index)
            return data
        finally:
            lock.release()

    def _evict(self, index: dict, incoming: int) -> None:
        total = sum(v["bytes"] for v in index.values())
        for name in sorted(index, key=lambda n: index[n].get("used", 0)):
            if total + incoming <= self.limit:
                break
            path = self.folder / name
            if path.is_file() and not path.is_symlink():
                path.unlink()   # an open copy in another process stays readable (POSIX)
            total -= index.pop(name)["bytes"]
        self._save(index)


class StreamSplit(Dataset):
    """One split of a prepared source as a map-style dataset: `self[i]` is row i's fields as
    numpy arrays. Picklable (loader workers open their own files); each process keeps the
    shards of one window of the order decoded (SHARD_WINDOW), so an epoch decodes each shard
    once in each process that reads it."""

    def __init__(self, url: str, split: str, cache_dir: "str | None" = None, cache_limit: "str | int" = "20GB",
                 manifest: "dict | None" = None, keep: int = SHARD_WINDOW):
        self.url, self.split, self.keep = url.rstrip("/"), split, keep
        self.manifest = manifest or read_manifest(url)
        if split not in self.manifest["splits"]:
            raise DataError(f"{url} has no split {split!r} (it has {', '.join(self.manifest['splits'])})")
        self.shards = self.manifest["splits"][split]["shards"]
        # what a checkpoint records of the data (hasten.data.resumable.data_identity): a resume on
        # another source, or on this one prepared again, is refused
        self.data_identity = {"source": self.url, "split": split, "manifest": manifest_identity(self.manifest)}
        self.blocks = [s["rows"] for s in self.shards]
        self._starts = np.concatenate([[0], np.cumsum(self.blocks)]).astype(np.int64)
        self.remote = is_remote(url)
        limit = parse_bytes(cache_limit) if isinstance(cache_limit, str) else int(cache_limit)
        folder = Path(cache_dir).expanduser() if cache_dir else data_root() / "stream-cache"
        key = hashlib.sha256(json.dumps([self.url, self.manifest.get("digest")]).encode()).hexdigest()[:16]
        self.cache = ShardCache(folder / key, limit) if self.remote else None
        self._tables: "OrderedDict[int, Any]" = OrderedDict()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_tables"] = OrderedDict()
        return state

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _shard_bytes(self, shard: dict) -> bytes:
        """The bytes of `shard`, proven to be the ones its manifest lists (size and SHA-256)
        before any row of them is used: a local source in place, a remote one through the cache
        (ShardCache.read, which checks the same)."""
        name = shard["name"]
        if self.remote:
            fs, root = filesystem(self.url)
            return self.cache.read(fs, f"{root.rstrip('/')}/{name}", name, shard["bytes"], shard["sha256"],
                                   where=f"{self.url}/{name}")
        root = Path(self.url).expanduser().resolve()
        path = (root / name).resolve()
        if not path.is_relative_to(root):
            raise DataError(f"{self.url}: shard {name} is a link to {path}, outside the source; a prepared source "
                            "holds its own shards: prepare it again")
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise DataError(f"{self.url}: shard {name} is missing (its manifest lists it); copy the whole source "
                            "again, or prepare it again") from None
        except OSError as e:
            raise DataError(f"{self.url}: shard {name} cannot be read ({e.strerror or e}); check the folder's "
                            "permissions, or prepare the source again") from None
        if len(data) != shard["bytes"]:
            raise DataError(f"{self.url}: shard {name} has {len(data):,} bytes, its manifest says {shard['bytes']:,}; "
                            f"{_AGAIN}")
        got = hashlib.sha256(data).hexdigest()
        if got != shard["sha256"]:
            raise DataError(f"{self.url}: shard {name} is not the shard its manifest lists (its SHA-256 is "
                            f"{got[:12]}..., the manifest says {shard['sha256'][:12]}...); {_AGAIN}")
        return data

    def _table(self, s: int):
        if s in self._tables:
            self._tables.move_to_end(s)
            return self._tables[s]
        import pyarrow as pa   # optional extra: stream
        import pyarrow.parquet as pq
        shard = self.shards[s]
        data = self._shard_bytes(shard)
        try:
            table = pq.read_table(pa.BufferReader(data))
        except Exception as e:   # bytes the manifest vouches for that pyarrow cannot read: prepared by another tool
            raise DataError(f"{self.url}: shard {shard['name']} cannot be read ({type(e).__name__}: "
                            f"{first_line(e)[:120]}); prepare the source again") from None
        if table.num_rows != shard["rows"]:
            raise DataError(f"{self.url}: shard {shard['name']} has {table.num_rows} rows, the manifest says "
                            f"{shard['rows']}; prepare the source again")
        columns = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
        self._tables[s] = columns
        while len(self._tables) > self.keep:
            self._tables.popitem(last=False)
        return columns

    def row(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(i)
        s = int(np.searchsorted(self._starts, i, side="right") - 1)
        columns = self._table(s)
        return {name: col[i - self._starts[s]] for name, col in columns.items()}


class StreamTokens(Dataset):
    """Token windows of a prepared token source: item i is (inputs, targets), the window and the
    same shifted by one, cut to `block_size`; with `segments`, inputs are {"idx", "segments"}."""

    def __init__(self, split: StreamSplit, block_size: int, segments: bool = False):
        stored = split.manifest["block_size"]
        if block_size > stored:
            raise ConfigError(f"data.block_size={block_size} is longer than the windows of {split.url} "
                              f"({stored} tokens); give at most {stored}, or prepare it with --block-size {block_size}")
        self.split, self.block_size, self.segments = split, block_size, segments

    def __len__(self) -> int:
        return len(self.split)

    def window(self, i: int) -> tuple[torch.Tensor, "torch.Tensor | None"]:
        r = self.split.row(i)
        tokens = torch.from_numpy(np.asarray(r["tokens"], dtype=np.int64)[: self.block_size + 1])
        segs = torch.from_numpy(np.asarray(r["segments"], dtype=np.int64)[: self.block_size]) if self.segments else None
        return tokens, segs

    def __getitem__(self, i):
        tokens, segs = self.window(i)
        x, y = tokens[:-1], tokens[1:]
        return ({"idx": x, "segments": segs}, y) if segs is not None else (x, y)


class StreamImages(Dataset):
    """Images of a prepared image source: item i is (uint8 HWC tensor, label), or a PIL image
    with `pil=True` (for the image-folder transforms)."""

    def __init__(self, split: StreamSplit, pil: bool = False):
        self.split, self.pil = split, pil
        self.classes = list(split.manifest.get("classes") or [])

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i):
        r = self.split.row(i)
        shape = tuple(int(v) for v in r["shape"])
        image = np.frombuffer(r["image"], dtype=np.uint8).reshape(shape)
        if self.pil:
            return _pil().fromarray(image), int(r["label"])
        return torch.from_numpy(image.copy()), int(r["label"])


class MaskPairs:
    """Masked-LM masking of one window (hasten.data.masking.mask_tokens), drawn from the
    sample's own generator: inputs and targets of a streamed BERT batch."""
    pairs = True

    def __init__(self, mask: dict):
        self.mask = mask

    def __call__(self, x, y, g):
        ids = x["idx"] if isinstance(x, dict) else x
        inputs, targets = mask_tokens(ids, g, **self.mask)
        return ({**x, "idx": inputs} if isinstance(x, dict) else inputs), targets


def load_tokenizer(url: str, manifest: dict):
    """The BPE tokenizer a prepared token source carries, checked against its recorded digest."""
    fs, root = filesystem(url)
    name = manifest["tokenizer"]   # a plain file name inside the source (manifest_problem)
    try:
        with fs.open(f"{root.rstrip('/')}/{name}", "rb") as f:
            data = f.read(1 << 28)
    except OSError as e:
        raise DataError(f"{url}: its tokenizer {name} cannot be read ({e}); prepare the source again") from None
    Tokenizer, = _tokenizers("Tokenizer")
    try:
        tok = BPE(Tokenizer.from_str(data.decode()))
    except Exception as e:   # not a tokenizer the tokenizers library reads
        raise DataError(f"{url}: its tokenizer {name} cannot be read ({type(e).__name__}: {first_line(e)[:100]}); "
                        f"{_AGAIN}") from None
    if tok.digest != manifest.get("tokenizer_sha256"):
        raise DataError(f"{url}: its tokenizer {name} is not the one its manifest records; {_AGAIN}")
    return tok


def open_source(url: str, kind: str, key: str, options: StreamOptions) -> dict:
    """The manifest of the prepared source a recipe names (`key` for messages), checked to be of
    `kind`."""
    m = read_manifest(url)
    if m["kind"] != kind:
        raise ConfigError(f"{key}={url}: a prepared source of {m['kind']}, this task reads {kind}")
    return m


def splits(url: str, manifest: dict, options: StreamOptions, names: tuple[str, str]) -> tuple[StreamSplit, StreamSplit]:
    """The training and evaluation splits (`names`) of a prepared source."""
    return tuple(StreamSplit(url, n, options.stream_cache, options.stream_cache_limit, manifest) for n in names)


__all__ = ["MANIFEST", "ShardCache", "StreamImages", "StreamOptions", "StreamSplit", "StreamTokens", "filesystem",
           "is_remote", "is_stream", "manifest_problem", "read_manifest", "shard_local_order", "shards_digest",
           "manifest_identity"]
