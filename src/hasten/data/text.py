"""Character- and byte-level text data for language models.

Training batches are random contiguous windows (as in nanoGPT), drawn from a generator
seeded by (seed, epoch, batch index): reproducible and resumable at any batch. Evaluation
is a fixed, deterministic pass of non-overlapping windows over the whole validation split,
so validation losses are comparable between recipes.
"""
from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from ..seeding import derive_seed
from .batches import share_range
from .download import DatasetNotFoundError

PACKAGED = {"tinyshakespeare": "tinyshakespeare.txt"}


def load_text(source: str | None = "tinyshakespeare") -> str:
    """The packaged Tiny Shakespeare (source='tinyshakespeare' or None) or any UTF-8 text file."""
    if source is None or source in PACKAGED:
        name = PACKAGED[source or "tinyshakespeare"]
        return resources.files("hasten.data").joinpath(name).read_text(encoding="utf-8")
    path = Path(source).expanduser()
    if not path.is_file():
        raise DatasetNotFoundError(f"text file {path} not found: give the path of a UTF-8 text file, "
                                   f"or one of the packaged corpora {sorted(PACKAGED)}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text ({e}); convert it to UTF-8") from e
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from e
    if not text:
        raise DataError(f"{path} is empty: give a text file to train on")
    return text


_CHUNK = 1 << 20   # characters encoded at a time
_NUMPY = {torch.uint8: np.uint8, torch.int16: np.int16, torch.int32: np.int32, torch.long: np.int64}


def compact_dtype(vocab_size: int) -> torch.dtype:
    """The smallest integer dtype that holds every id of a vocabulary of `vocab_size`: a corpus
    held in it costs 1-4 bytes a token instead of int64's 8; the windows drawn from it are
    made int64 batch by batch (RandomWindows, EvalWindows)."""
    return torch.uint8 if vocab_size <= 256 else torch.int16 if vocab_size <= 1 << 15 else torch.int32


class CharTokenizer:
    """One token per distinct character, in sorted order (65 for Tiny Shakespeare)."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    @property
    def digest(self) -> str:
        """What identifies this tokenizer (its characters): a run records it (tokenizer_sha256)."""
        return hashlib.sha256("".join(self.chars).encode("utf-8", "surrogatepass")).hexdigest()

    def encode(self, text: str, dtype: torch.dtype = torch.long) -> torch.Tensor:
        """The ids of `text`'s characters, as `dtype` (`compact_dtype(vocab_size)` stores a corpus
        in 1-2 bytes a character instead of 8). Vectorised: no Python object per character."""
        known = np.fromiter((ord(c) for c in self.chars), dtype=np.uint32, count=len(self.chars))   # sorted
        if text and not len(known):
            raise ValueError(f"character {text[0]!r} is not in the vocabulary (it is empty)")
        out = np.empty(len(text), dtype=_NUMPY.get(dtype, np.int64))
        for start in range(0, len(text), _CHUNK):   # in chunks: the temporaries stay small
            codes = np.frombuffer(text[start:start + _CHUNK].encode("utf-32-le"), dtype=np.uint32)
            ids = np.searchsorted(known, codes).clip(max=len(known) - 1)
            bad = np.flatnonzero(known[ids] != codes)
            if bad.size:
                raise ValueError(f"character {chr(codes[bad[0]])!r} is not in the vocabulary")
            out[start:start + len(codes)] = ids
        return torch.from_numpy(out).to(dtype)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


class ByteTokenizer:
    """UTF-8 bytes: a fixed vocabulary of 256."""

    vocab_size = 256
    digest = hashlib.sha256(b"utf-8 bytes").hexdigest()   # one fixed vocabulary

    def encode(self, text: str, dtype: torch.dtype = torch.long) -> torch.Tensor:
        """The UTF-8 bytes of `text` as ids, as `dtype` (torch.uint8 holds them in a byte each)."""
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).to(dtype)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def split_tokens(tokens: torch.Tensor, train_fraction: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
    n = int(len(tokens) * train_fraction)
    return tokens[:n], tokens[n:]


def load_token_file(path, dtype: str = "uint16"):
    """A flat file of token ids (nanoGPT's train.bin / val.bin: uint16 for GPT-2's vocabulary),
    memory-mapped: only the windows drawn are read."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DatasetNotFoundError(f"token file {p} not found: give a flat binary file of {dtype} token ids "
                                "(e.g. nanoGPT's data/openwebtext/prepare.py writes train.bin and val.bin)")
    return np.memmap(p, dtype=np.dtype(dtype), mode="r")


def check_token_range(tokens, vocab_size: int, where, key: str = "vocab_size") -> None:
    """Every id in `tokens` (a tensor or a memory-mapped array, read once in chunks) is in
    [0, vocab_size); else a DataError naming the file, the largest id and `key`."""
    n, chunk, lo, hi = len(tokens), 1 << 24, 0, -1
    for start in range(0, n, chunk):
        part = tokens[start:start + chunk]
        part = part.numpy() if isinstance(part, torch.Tensor) else np.asarray(part)
        if part.size:
            lo, hi = min(lo, int(part.min())), max(hi, int(part.max()))
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise DataError(f"{where}: token id {bad} is outside the vocabulary [0, {vocab_size}); set {key} to at least "
                        f"{hi + 1} or check the file's token_dtype")


def _as_long(tokens) -> torch.Tensor:
    if isinstance(tokens, np.ndarray):
        return torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    return tokens.long()


class RandomWindows:
    """Batches of `batch_size` random windows of `block_size` tokens (inputs) and the same
    windows shifted by one (targets). An epoch is len(tokens) // (batch_size * block_size)
    batches: about one pass worth of tokens. `tokens` may be a tensor or a (memory-mapped)
    numpy array, from which only the drawn windows are read.

    Under data parallelism (`shard_for_rank`, which the Trainer calls) every rank draws the
    global batch's window starts and reads only its share of the windows."""

    def __init__(self, tokens, block_size: int, batch_size: int, seed: int = 0, segments=None):
        if len(tokens) <= block_size + 1:
            raise ValueError(f"the text has {len(tokens)} tokens; it needs more than block_size+1={block_size + 1}")
        self._mapped = not isinstance(tokens, torch.Tensor)
        self.tokens = tokens if self._mapped or not tokens.is_floating_point() else tokens.long()   # kept compact
        self.segments = None if segments is None else _as_long(segments)
        self.block_size, self.batch_size, self.seed = block_size, batch_size, seed
        self._offsets = torch.arange(block_size + 1)
        self._part = slice(None)

    def __len__(self) -> int:
        return max(1, len(self.tokens) // (self.batch_size * self.block_size))

    def shard_for_rank(self, rank: int, world_size: int) -> None:
        """From now on yield rank `rank`'s share of every global batch."""
        self._part = slice(*share_range(self.batch_size, rank, world_size))

    def global_batch_size(self, epoch: int, index: int) -> int:
        return self.batch_size

    def batch(self, epoch: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(derive_seed(self.seed, epoch, index))
        starts = torch.randint(len(self.tokens) - self.block_size - 1, (self.batch_size,), generator=g)
        idx = starts[self._part, None] + self._offsets
        windows = _as_long(self.tokens[idx.numpy()] if self._mapped else self.tokens[idx])
        if self.segments is not None:   # each input token's document: attention stays inside it
            return {"idx": windows[:, :-1], "segments": self.segments[idx[:, :-1]]}, windows[:, 1:]
        return windows[:, :-1], windows[:, 1:]

    def iter_epoch(self, epoch: int, skip_batches: int = 0):
        for i in range(skip_batches, len(self)):
            yield self.batch(epoch, i)

    def __iter__(self):
        return self.iter_epoch(0)


class EvalWindows:
    """Non-overlapping windows of `block_size` over all of `tokens`, in order, batched; under
    data parallelism (`shard_for_rank`) each rank yields its share of every batch, so every
    window is evaluated once."""

    def __init__(self, tokens: torch.Tensor, block_size: int, batch_size: int = 64, segments=None):
        n = (len(tokens) - 1) // block_size
        if n < 1:
            raise ValueError(f"the validation text has {len(tokens)} tokens, fewer than one window of {block_size}")
        self.block_size, self.batch_size = block_size, batch_size
        # the tokens' own dtype and storage (a memory-mapped file stays mapped): int64 a batch at a time
        self.x = tokens[: n * block_size].reshape(n, block_size)
        self.y = tokens[1: n * block_size + 1].reshape(n, block_size)
        self.s = None if segments is None else _as_long(segments[: n * block_size]).view(n, block_size)
        self.rank, self.world_size = 0, 1

    def __len__(self) -> int:
        return -(-len(self.x) // self.batch_size)

    def shard_for_rank(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = int(rank), int(world_size)

    def global_batch_size(self, epoch: int, index: int) -> int:
        return min(self.batch_size, len(self.x) - index * self.batch_size)

    def __iter__(self):
        for i in range(0, len(self.x), self.batch_size):
            start, stop = share_range(min(self.batch_size, len(self.x) - i), self.rank, self.world_size)
            x, y = _as_long(self.x[i + start:i + stop]), _as_long(self.y[i + start:i + stop])
            yield ({"idx": x, "segments": self.s[i + start:i + stop]}, y) if self.s is not None else (x, y)
