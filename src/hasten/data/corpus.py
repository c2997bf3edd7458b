"""Corpora of documents: read them, split them by document, tokenize them (byte-level BPE), and
pack them into windows.

Sources, as a user has them: a `.txt` file (one document), a folder of `.txt` files (one
document each, in name order), a `.zip` or `.tar(.gz)` archive of `.txt` files (the same, read in
place), a `.jsonl` or `.jsonl.gz` file (one JSON object a line, the
document in `text_field`; the other fields kept as the document's metadata), a packaged name
(`prose`, the English prose corpus of the project's data folder when it is there), or a URL
with its SHA-256 (`https://...#sha256=HEX`), downloaded once into the data folder
(hasten.data.download) and read as above.

The split is by document, never by cutting one in two: document i (in file order) goes to
validation when i % val_every == val_every - 1 (every tenth by default), to training otherwise.

Tokens: `train_bpe` trains a byte-level BPE tokenizer (the `tokenizers` library) on the
training split only, with an end-of-document token `<|endoftext|>`; `corpus_tokenizer` caches
it in the data folder, keyed by the corpus's content hash and the vocabulary size, or loads a
user's `tokenizer.json`. Encoded documents are cached the same way. `pack` lays documents end
to end with the end-of-document token between them and records each token's document number,
so attention can be kept inside documents (`segments`).
"""
from __future__ import annotations

import gzip
import itertools
import hashlib
import json
import os
import re
import urllib.parse
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConfigError, DataError
from ..files import atomic_write
from ..processes import spawn, stop
from ..files import file_digest
from .download import DatasetNotFoundError, data_root, download

EOD = "<|endoftext|>"


@dataclass
class Document:
    text: str
    meta: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------- reading
def _shared_prose() -> Path | None:
    """The prose corpus beside a checkout (tests and benchmarks of this project), if there."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        p = parent.parent / "shared" / "data" / "prose.jsonl.gz"
        if p.is_file():
            return p
    return None


_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def resolve_source(source: str) -> Path:
    """The local file or folder a source names. A URL with its SHA-256 is downloaded once into
    the data folder, under a path made of the full checksum (never of the user's text as it
    is), and the cached copy is checked against that checksum before every use."""
    if source.startswith(("http://", "https://", "file://")):
        url, _, frag = source.partition("#")
        sha = frag[len("sha256="):] if frag.startswith("sha256=") else None
        if not sha:
            raise DataError(f"{source}: give the file's checksum after the URL as #sha256=HEX, so that what is "
                            "downloaded is known to be the corpus you mean")
        if not _SHA256.match(sha):
            raise DataError(f"{url}: #sha256={sha[:80]!r} is not a SHA-256 (64 hexadecimal digits); give the "
                            "file's full checksum, as `sha256sum FILE` prints it")
        sha = sha.lower()
        # the file's name, and so its type (.jsonl, .gz), comes from the URL's path, never its query (a signed
        # object-store URL's ?X-Amz-Signature=...)
        path = urllib.parse.urlsplit(url).path
        name = _SAFE_NAME.sub("_", path.rstrip("/").rsplit("/", 1)[-1])[-80:].lstrip(".") or "corpus"
        dest = data_root() / "corpora" / sha / name   # keyed by what proves the content: the whole checksum
        if dest.is_file():   # downloaded before: used only if it still has that checksum
            if file_digest(dest, "sha256") != sha:
                raise DataError(f"the cached download {dest} no longer has sha256 {sha[:12]}... (it changed on disk): "
                                "delete it, and hasten downloads the corpus again")
            return dest
        return download(url, dest, checksum=sha, algorithm="sha256", what=f"the corpus {name}")
    if source == "prose":
        found = Path(os.environ.get("HASTEN_PROSE", "")) if os.environ.get("HASTEN_PROSE") else _shared_prose()
        if found is None or not found.is_file():
            raise DatasetNotFoundError("the prose corpus (prose.jsonl.gz) is not here: set HASTEN_PROSE to its path, "
                                       "or give data.source a .txt, .jsonl(.gz) file or folder of your own")
        return found
    p = Path(source).expanduser()
    if not p.exists():
        raise DatasetNotFoundError(f"corpus {source} not found: give a .txt file, a folder of .txt files, a "
                                   ".jsonl or .jsonl.gz file with a text field, or a URL#sha256=HEX")
    return p


# What reading a corpus may take, in MiB of UTF-8 text (decompressed), each raised by its
# environment variable: a document (a .txt file, an archive member, a JSON line), one line of
# it, and the whole corpus. A small archive can expand to gigabytes, and one very long line is
# what makes BPE training take tens of gigabytes; both are refused before they are read whole.
LIMITS = {"document": ("HASTEN_MAX_DOCUMENT_MB", 64), "line": ("HASTEN_MAX_LINE_MB", 1),
          "corpus": ("HASTEN_MAX_CORPUS_MB", 4096)}


def limit_bytes(kind: str) -> int:
    env, default = LIMITS[kind]
    raw = os.environ.get(env)
    if raw is None:
        return default << 20
    try:
        value = float(raw)
        if not value > 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{env}={raw!r}: give a size in MiB, a number > 0 (default {default})") from None
    return int(value * (1 << 20))


def _too_big(what: str, kind: str) -> DataError:
    env, default = LIMITS[kind]
    return DataError(f"{what} is larger than the {kind} limit ({limit_bytes(kind) >> 20} MiB); if it is meant to be "
                     f"read, raise it with {env}=MiB (default {default})")


class _Budget:
    """The corpus limit, spent as documents are read."""

    def __init__(self, source):
        self.left, self.source = limit_bytes("corpus"), source

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _too_big(f"the corpus {self.source}", "corpus")


def _check_lines(text: str, what: str) -> str:
    cap = limit_bytes("line")
    if len(text) * 4 > cap:   # a line could be over the limit only then (4 bytes a character at most)
        for line in text.splitlines():
            if len(line) * 4 > cap and len(line.encode("utf-8", "surrogatepass")) > cap:
                raise _too_big(f"a line of {what}", "line")
    return text


def read_documents(source: str, text_field: str = "text") -> list[Document]:
    """The documents of `source` (see the module docstring), in order; empty ones dropped. What
    is read is bounded (LIMITS): a document, a line and the whole corpus."""
    path = resolve_source(source)
    docs: list[Document] = []
    budget = _Budget(path)
    if path.name.endswith((".zip", ".tar.gz", ".tgz", ".tar")):
        docs = _archive_documents(path, budget)
    elif path.is_dir():
        files = sorted(path.glob("*.txt"))
        if not files:
            raise DataError(f"{path}: the folder holds no .txt files")
        docs = [Document(_read_text(f, budget), {"title": f.stem}) for f in files]
    elif path.name.endswith((".jsonl", ".jsonl.gz")):
        opener = gzip.open if path.name.endswith(".gz") else open
        cap = limit_bytes("document")
        try:
            with opener(path, "rb") as f:
                for n in itertools.count(1):
                    raw = f.readline(cap + 1)
                    if not raw:
                        break
                    if len(raw) > cap:
                        raise _too_big(f"{path}, line {n}", "document")
                    budget.take(len(raw))
                    line = raw.decode("utf-8")
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DataError(f"{path}, line {n}: not JSON ({e.msg}); each line must be one JSON object") from None
                    if not isinstance(row, dict) or not isinstance(row.get(text_field), str):
                        keys = sorted(row) if isinstance(row, dict) else type(row).__name__
                        raise DataError(f"{path}, line {n}: no text field {text_field!r} (found {keys}); set "
                                        "data.text_field to the field that holds the text")
                    text = _check_lines(row[text_field], f"{path}, line {n}")
                    docs.append(Document(text, {k: v for k, v in row.items() if k != text_field}))
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise DataError(f"cannot read {path}: {e}; the file is damaged or not UTF-8 JSON lines") from e
    else:
        docs = [Document(_read_text(path, budget), {"title": path.stem})]
    docs = [d for d in docs if d.text.strip()]
    if not docs:
        raise DataError(f"{path}: no document with text")
    return docs


def _archive_documents(path: Path, budget: _Budget) -> list[Document]:
    """The .txt members of a zip or tar archive, one document each, in name order (read in
    place, nothing extracted; each member's size checked before it is read, and read no
    further than the limit whatever its header says)."""
    import tarfile
    import zipfile
    cap = limit_bytes("document")

    def bounded(name: str, stream) -> bytes:
        raw = stream.read(cap + 1)
        if len(raw) > cap:
            raise _too_big(f"{path}: member {name}", "document")
        budget.take(len(raw))
        return raw
    try:
        if path.name.endswith(".zip"):
            with zipfile.ZipFile(path) as z:
                infos = sorted((i for i in z.infolist() if i.filename.endswith(".txt")), key=lambda i: i.filename)
                for i in infos:
                    if i.file_size > cap:
                        raise _too_big(f"{path}: member {i.filename}", "document")
                texts = []
                for i in infos:
                    with z.open(i) as f:
                        texts.append((i.filename, bounded(i.filename, f)))
        else:
            with tarfile.open(path) as t:
                members = sorted((m for m in t.getmembers() if m.isfile() and m.name.endswith(".txt")),
                                 key=lambda m: m.name)
                for m in members:
                    if m.size > cap:
                        raise _too_big(f"{path}: member {m.name}", "document")
                texts = [(m.name, bounded(m.name, t.extractfile(m))) for m in members]
    except (OSError, zipfile.BadZipFile, tarfile.TarError, EOFError) as e:
        raise DataError(f"cannot read the archive {path}: {e}; it is damaged or not a zip or tar file") from e
    if not texts:
        raise DataError(f"{path}: the archive holds no .txt files")
    out = []
    for name, raw in texts:
        try:
            out.append(Document(_check_lines(raw.decode("utf-8"), f"{path}: member {name}"), {"title": Path(name).stem}))
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: member {name} is not UTF-8 text ({e})") from e
    return out


def _read_text(path: Path, budget: "_Budget | None" = None) -> str:
    cap = limit_bytes("document")
    try:
        with open(path, "rb") as f:
            raw = f.read(cap + 1)
        if len(raw) > cap:
            raise _too_big(str(path), "document")
        if budget is not None:
            budget.take(len(raw))
        return _check_lines(raw.decode("utf-8"), str(path))
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text ({e}); convert it to UTF-8") from e
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from e


def split_documents(docs: list, val_every: int = 10) -> tuple[list, list]:
    """(training, validation): document i goes to validation when i % val_every == val_every - 1."""
    if val_every < 2:
        raise ValueError(f"val_every must be at least 2, got {val_every}")
    train = [d for i, d in enumerate(docs) if i % val_every != val_every - 1]
    val = [d for i, d in enumerate(docs) if i % val_every == val_every - 1]
    if not train or not val:
        raise DataError(f"{len(docs)} document(s): too few to hold out every {val_every}th for validation; give "
                        "more documents or a smaller data.val_every")
    return train, val


def content_hash(docs: list[Document]) -> str:
    """SHA-256 over the documents' texts, in order: what a cached tokenizer was trained on."""
    h = hashlib.sha256()
    for d in docs:
        b = d.text.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


# ---------------------------------------------------------------------------- tokens
def _tokenizers(*names):
    """Attributes of the `tokenizers` library (the `text` extra), or a one-line error naming it."""
    try:
        import tokenizers   # optional extra: text (tokenizers)
    except ImportError:
        raise ConfigError("data.tokenizer=bpe needs the tokenizers library: pip install 'hasten[text]'") from None
    return tuple(getattr(tokenizers, n) for n in names)


# BPE training is one long call into `tokenizers` that no signal interrupts, so it runs in a
# child process of its own (the few lines below, no torch): SIGTERM or Ctrl-C stop the command
# at once, and the child with it (hasten.processes).
_TRAIN_BPE = """
import json, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
texts_file, out_file, vocab_size, specials = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
def texts():
    with open(texts_file, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)
tok.train_from_iterator(texts(), trainer=trainer)
tok.save(out_file)
"""


def train_bpe(texts: list[str], vocab_size: int, specials: tuple[str, ...] = (EOD,)):
    """A byte-level BPE tokenizer (`tokenizers`) trained on `texts`, in a child process;
    `specials` get the first ids."""
    Tokenizer, = _tokenizers("Tokenizer")
    with tempfile.TemporaryDirectory(prefix="hasten-bpe-") as tmp:
        texts_file, out_file = Path(tmp, "texts.jsonl"), Path(tmp, "tokenizer.json")
        with open(texts_file, "w", encoding="utf-8") as f:
            for x in texts:
                f.write(json.dumps(x) + "\n")
        with open(Path(tmp, "log.txt"), "w+") as log:
            proc = spawn([sys.executable, "-c", _TRAIN_BPE, str(texts_file), str(out_file), str(vocab_size),
                          json.dumps(list(specials))], stdout=log, stderr=subprocess.STDOUT)
            try:
                rc = proc.wait()
            except BaseException:   # Ctrl-C, SIGTERM: the child goes first, then its folder
                stop(proc, grace_s=1.0)
                raise
            if rc != 0 or not out_file.is_file():
                log.seek(0)
                tail = (log.read().strip().splitlines() or ["no output"])[-1][:300]
                raise DataError(f"training the BPE tokenizer failed ({tail})")
        return Tokenizer.from_file(str(out_file))


class BPE:
    """A `tokenizers` tokenizer with hasten's few needs: encode, decode, vocabulary size and
    the special tokens' ids."""

    def __init__(self, tok):
        self.tok = tok

    @classmethod
    def load(cls, path) -> "BPE":
        Tokenizer, = _tokenizers("Tokenizer")
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as e:
            raise DataError(f"cannot read tokenizer {path}: {e}; give a tokenizer.json of the tokenizers library") from e

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    @property
    def digest(self) -> str:
        """What identifies this tokenizer (its whole serialised form): a run records it."""
        return hashlib.sha256(self.tok.to_str().encode()).hexdigest()

    def token_id(self, token: str) -> int:
        i = self.tok.token_to_id(token)
        if i is None:
            raise DataError(f"the tokenizer has no {token!r} token; train one with it, or add it to your tokenizer.json")
        return i

    def encode_batch(self, texts: list[str], chunk_chars: int = 1 << 22) -> list[list[int]]:
        """Each text's ids; in chunks of about `chunk_chars` characters, so that a signal is
        seen between them (one call into `tokenizers` is not interrupted)."""
        out, start, size = [], 0, 0
        for i, x in enumerate(texts):
            size += len(x)
            if size >= chunk_chars or i == len(texts) - 1:
                out += [e.ids for e in self.tok.encode_batch(texts[start:i + 1])]
                start, size = i + 1, 0
        return out

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids])

    def save(self, path) -> None:
        atomic_write(Path(path), lambda f: f.write(self.tok.to_str()), binary=False)


def corpus_tokenizer(train_docs: list[Document], vocab_size: int, tokenizer_file: str | None = None,
                     specials: tuple[str, ...] = (EOD,)) -> BPE:
    """The user's tokenizer.json, or a byte-level BPE trained on the training documents and
    cached by their content hash, the vocabulary size and the special tokens."""
    if tokenizer_file:
        return BPE.load(tokenizer_file)
    key = hashlib.sha256(f"{content_hash(train_docs)}|{vocab_size}|{'|'.join(specials)}".encode()).hexdigest()[:20]
    path = data_root() / "tokenizers" / f"bpe-{vocab_size}-{key}.json"
    if path.is_file():
        try:
            return BPE.load(path)
        except DataError:
            pass   # a damaged cache: trained again below
    path.parent.mkdir(parents=True, exist_ok=True)
    tok = BPE(train_bpe([d.text for d in train_docs], vocab_size, specials))
    tok.save(path)
    return tok


def encode_documents(tok: BPE, docs: list[Document], cache_key: str | None = None) -> list[np.ndarray]:
    """Each document's token ids (int32); cached in the data folder under `cache_key` (with
    the tokenizer's hash) when given."""
    path = None
    if cache_key:
        tkey = tok.digest[:16]
        path = data_root() / "tokens" / f"{cache_key}-{tkey}.npz"
        if path.is_file():
            try:
                with np.load(path) as z:
                    flat, lengths = z["flat"], z["lengths"]
                if len(lengths) == len(docs):
                    return np.split(flat, np.cumsum(lengths)[:-1])
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
                pass   # a damaged cache: encoded again below
    ids = [np.asarray(x, dtype=np.int32) for x in tok.encode_batch([d.text for d in docs])]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        flat = np.concatenate(ids) if ids else np.zeros(0, np.int32)
        atomic_write(path, lambda f: np.savez(f, flat=flat, lengths=np.asarray([len(x) for x in ids], np.int64)))
    return ids


def pack(docs_ids: list[np.ndarray], eod: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, segments): the documents end to end, each followed by the end-of-document token,
    and each token's document number (the end-of-document token belongs to its document)."""
    parts, segs = [], []
    for i, ids in enumerate(docs_ids):
        parts.append(np.append(ids, eod).astype(np.int32))
        segs.append(np.full(len(ids) + 1, i, dtype=np.int32))
    return np.concatenate(parts), np.concatenate(segs)


def token_bytes(tok: BPE) -> np.ndarray:
    """Each token id's length in bytes of text (byte-level BPE: one symbol per byte; special
    tokens 0): what bits per byte divide by."""
    special = set(tok.tok.get_added_tokens_decoder()) if hasattr(tok.tok, "get_added_tokens_decoder") else set()
    out = np.zeros(tok.vocab_size, dtype=np.int64)
    for i in range(tok.vocab_size):
        piece = tok.tok.id_to_token(i)
        out[i] = 0 if (piece is None or i in special) else len(piece)
    return out


@dataclass
class TokenizedCorpus:
    """A corpus split by document and tokenized: the tokenizer, and each split's packed tokens
    with each token's document number."""
    tokenizer: BPE
    train_tokens: np.ndarray
    train_segments: np.ndarray
    val_tokens: np.ndarray
    val_segments: np.ndarray
    documents: tuple[int, int]   # (training, validation) documents


def tokenized_corpus(source: str, text_field: str = "text", val_every: int = 10, vocab_size: int = 8192,
                     tokenizer_file: str | None = None, specials: tuple[str, ...] = (EOD,)) -> TokenizedCorpus:
    """Read, split by document, tokenize (BPE trained on the training split, or the given
    tokenizer.json) and pack a corpus; the tokens are cached in the data folder."""
    docs = read_documents(source, text_field)
    train, val = split_documents(docs, val_every)
    tok = corpus_tokenizer(train, vocab_size, tokenizer_file, specials)
    ids = encode_documents(tok, docs, cache_key=content_hash(docs)[:20])
    eod = tok.token_id(EOD)
    tr = [x for i, x in enumerate(ids) if i % val_every != val_every - 1]
    va = [x for i, x in enumerate(ids) if i % val_every == val_every - 1]
    (tt, ts), (vt, vs) = pack(tr, eod), pack(va, eod)
    return TokenizedCorpus(tok, tt, ts, vt, vs, (len(train), len(val)))


__all__ = ["BPE", "EOD", "TokenizedCorpus", "token_bytes", "tokenized_corpus", "Document", "content_hash", "corpus_tokenizer", "encode_documents", "pack", "read_documents",
           "resolve_source", "split_documents", "train_bpe"]
