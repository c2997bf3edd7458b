"""CIFAR-10: the official archive (downloaded with its checksum), an already-downloaded
copy, or an image-folder zip (`train/<class>/<index>.png|jpg`, `test/<class>/...`).

Images come back as uint8 tensors of shape (N, 32, 32, 3) with int64 labels. Decoded
image-folder zips are cached as .npz beside the data root, keyed by the zip's size and
modification time, so decoding (about 10 s) happens once.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import tarfile
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from ..files import atomic_write
from ..files import file_digest
from .download import DatasetNotFoundError, data_root, download

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"   # published with the archive
ARCHIVE = "cifar-10-python.tar.gz"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
MEAN = (125.307, 122.961, 113.8575)        # training-set channel means, 0..255
STD = (62.9932, 62.0887, 66.7048)


@dataclass
class ImageData:
    train_x: torch.Tensor   # (N, H, W, 3) uint8
    train_y: torch.Tensor   # (N,) int64
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: tuple = CLASSES


class _ArrayUnpickler(pickle.Unpickler):
    """The official batches are pickles of numpy arrays: allow those types and nothing else."""

    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy", "ndarray"), ("numpy", "dtype")}

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch file")


def _read_batch(f) -> tuple[np.ndarray, np.ndarray]:
    d = _ArrayUnpickler(f, encoding="bytes").load()
    x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(x), np.asarray(d[b"labels"], dtype=np.int64)


def _from_official(read) -> ImageData:
    parts = [_read_batch(read(f"data_batch_{i}")) for i in range(1, 6)]
    tx, ty = _read_batch(read("test_batch"))
    return ImageData(torch.from_numpy(np.concatenate([p[0] for p in parts])),
                     torch.from_numpy(np.concatenate([p[1] for p in parts])),
                     torch.from_numpy(tx), torch.from_numpy(ty))


def read_official_archive(path: "str | os.PathLike") -> ImageData:
    try:
        return _read_official_archive(path)
    except (tarfile.TarError, EOFError, OSError, pickle.UnpicklingError, ValueError) as e:
        if isinstance(e, DatasetNotFoundError):
            raise
        raise DataError(f"{path} cannot be read as the CIFAR-10 python archive ({type(e).__name__}: {e}): "
                        "it is damaged or truncated; download it again") from e


def _read_official_archive(path) -> ImageData:
    with tarfile.open(path, "r:gz") as tar:
        members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}

        def read(name):
            if name not in members:
                raise DatasetNotFoundError(f"{path} has no {name}: is it the CIFAR-10 python archive?")
            return io.BytesIO(tar.extractfile(members[name]).read())
        return _from_official(read)


def read_official_folder(folder: "str | os.PathLike") -> ImageData:
    folder = Path(folder)
    return _from_official(lambda name: open(folder / name, "rb"))


def read_image_zip(path: "str | os.PathLike", classes=CLASSES, cache_dir: "str | os.PathLike | None" = None) -> ImageData:
    """Decode an image-folder zip once; later calls read the cached arrays. The cache is keyed
    by what proves the archive's content (every member's name, size and CRC-32, from its
    central directory) and the class list, never by its name, size or time: a copy made with
    `cp -p` over another archive of the same stem, size and time gets a cache of its own."""
    path = Path(path)
    cache_dir = Path(cache_dir) if cache_dir else data_root() / "cache"
    cache = cache_dir / f"{path.stem}-{_content_key(path, classes)}.npz"
    if cache.is_file():
        try:
            with np.load(cache) as z:
                return ImageData(*(torch.from_numpy(z[k]) for k in ("train_x", "train_y", "test_x", "test_y")),
                                 classes=tuple(classes))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            warnings.warn(f"the decoded cache {cache} is damaged ({type(e).__name__}: {e}); decoding {path.name} "
                          "again and rewriting it")
    try:
        from PIL import Image
    except ImportError as e:
        raise ImportError("reading image archives needs Pillow: pip install 'hasten[vision]'") from e
    try:
        out = _decode_zip(path, classes, Image)
    except zipfile.BadZipFile as e:
        raise DataError(f"{path} is not a readable zip ({e}): the file is damaged or truncated; "
                        "download or copy it again") from e
    except OSError as e:   # Pillow's UnidentifiedImageError is an OSError too
        raise DataError(f"{path}: {e}; the archive is damaged: download or copy it again") from e
    cache.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(cache, lambda f: np.savez(f, train_x=out["train"][0], train_y=out["train"][1],
                                           test_x=out["test"][0], test_y=out["test"][1]), error=DataError)
    return ImageData(torch.from_numpy(out["train"][0]), torch.from_numpy(out["train"][1]),
                     torch.from_numpy(out["test"][0]), torch.from_numpy(out["test"][1]), classes=tuple(classes))


def _content_key(path: Path, classes) -> str:
    try:
        with zipfile.ZipFile(path) as z:
            members = sorted((i.filename, i.file_size, i.CRC) for i in z.infolist())
    except zipfile.BadZipFile as e:
        raise DataError(f"{path} is not a readable zip ({e}): the file is damaged or truncated; "
                        "download or copy it again") from e
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from e
    h = hashlib.sha256(json.dumps([list(classes), members]).encode())
    return h.hexdigest()[:20]


def _decode(zf: zipfile.ZipFile, name: str, Image) -> np.ndarray:
    try:
        data = zf.read(name)   # checks the member's CRC
    except zipfile.BadZipFile as e:
        raise DataError(f"{zf.filename}: member {name} is damaged ({e}); download or copy the archive again") from e
    try:
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    except OSError as e:
        why = "unknown image format" if type(e).__name__ == "UnidentifiedImageError" else str(e)
        raise DataError(f"{zf.filename}: member {name} is not an image Pillow can decode ({why}); "
                        "download or copy the archive again") from e


def _decode_zip(path: Path, classes, Image) -> dict:
    index = {c: i for i, c in enumerate(classes)}
    splits = {"train": [], "test": []}
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            parts = name.strip("/").split("/")
            if len(parts) < 3 or parts[-3] not in splits or name.endswith("/"):
                continue
            split, cls, fname = parts[-3], parts[-2], parts[-1]
            if cls not in index:
                raise DataError(f"{path}: unknown class folder {cls!r} (expected one of {list(classes)})")
            splits[split].append((cls, fname, name))
        if not splits["train"] or not splits["test"]:
            raise DatasetNotFoundError(f"{path} has no train/<class>/ and test/<class>/ image folders")
        out = {}
        for split, items in splits.items():
            items.sort(key=lambda t: (t[1], t[0]) if split == "train" else (index[t[0]], t[1]))
            xs = np.stack([_decode(zf, n, Image) for _, _, n in items])
            ys = np.array([index[c] for c, _, _ in items], dtype=np.int64)
            out[split] = (xs, ys)
    return out


def load_cifar10(path: "str | os.PathLike | None" = None, download_if_missing: bool = True,
                 url: str = URL, md5: str = MD5) -> ImageData:
    """Load CIFAR-10 from `path` (official .tar.gz, its extracted folder, or an image-folder
    zip); with no path, from the data root, downloading the official archive if needed."""
    if path is not None:
        p = Path(path).expanduser()
        if p.suffix == ".zip" and p.is_file():
            return read_image_zip(p)
        if p.name.endswith((".tar.gz", ".tgz")) and p.is_file():
            return read_official_archive(p)
        if p.is_dir():
            for cand in (p, p / "cifar-10-batches-py"):
                if (cand / "data_batch_1").is_file():
                    return read_official_folder(cand)
            if (p / ARCHIVE).is_file():
                return read_official_archive(p / ARCHIVE)
        raise DatasetNotFoundError(
            f"no CIFAR-10 at {p}: give the official {ARCHIVE}, its extracted cifar-10-batches-py folder, "
            "or an image-folder zip with train/<class>/ and test/<class>/")
    root = data_root() / "cifar10"
    if (root / "cifar-10-batches-py" / "data_batch_1").is_file():
        return read_official_folder(root / "cifar-10-batches-py")
    archive = root / ARCHIVE
    if not archive.is_file():
        if not download_if_missing:
            raise DatasetNotFoundError(f"CIFAR-10 not found: put {ARCHIVE} (from {URL}) in {root}, "
                                       "or give data.path=")
        download(url, archive, md5, "md5", what="CIFAR-10")
    elif file_digest(archive, "md5") != md5:
        raise DatasetNotFoundError(f"{archive} does not match the published checksum: delete it to download again")
    return read_official_archive(archive)
