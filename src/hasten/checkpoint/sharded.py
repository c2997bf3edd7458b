"""Sharded checkpoints: torch.distributed.checkpoint (DCP) behind the CheckpointIO seam.

A sharded checkpoint is a folder `epE-baB.dcp`: every rank writes its shards of the model and
optimizer state through DCP (no rank gathers the model), and rank 0 adds `rest.pt`, which
holds everything else of the payload (the clock, random number generator states, schedulers,
algorithm and callback state, metadata) with each tensor of the model and optimizer state
replaced by its key in the DCP folder.

Loading never runs code from the checkpoint. DCP itself unpickles the folder's `.metadata`
with plain `pickle`, which would run whatever a crafted file asks; hasten reads it instead
with `SafeReader`, a restricted unpickler that rebuilds DCP's own metadata classes, torch's
dtypes, sizes, layouts and memory formats, and paths, and refuses every other global (the way
`torch.load(weights_only=True)` does for tensors). The metadata read is then checked: every
entry is a tensor (DCP loads a non-tensor entry with `torch.load(weights_only=False)`, and
hasten never writes one), and every shard file it names is a plain file name inside the folder.
The tensors load with `weights_only=True` and `rest.pt` too. Every DCP read hasten makes
(resume, `trainer.load_path`, `export_whole` for `hasten compress`) goes through SafeReader.

Atomic like a single file: the folder is written under a temporary name (`.epE-baB.dcp.partial.tmp`,
which checkpoint folders clear at their next start) and renamed once every rank has written
its part, so a kill during a save leaves the previous checkpoint as it was.

Loading reshards: the tensors are read into the current run's model and optimizer state as
they are sharded now (any world size, or none), so a checkpoint of two processes resumes
under one and the other way round. `export_whole` turns one into today's single file.
"""
from __future__ import annotations

import io
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path

import torch

from ..errors import CheckpointError, first_line
from ..files import atomic_write, fsync_dir
from .format import REST, check_optimizers, load_rest
from .whole import CheckpointIO

_MARK = "__dcp__:"   # a placeholder in rest.pt: the tensor is in the DCP folder under this key
_SHARD_FILE = re.compile(r"^[\w.-]+\.distcp$")   # the names DCP gives its shard files


# ---------------------------------------------------------------------------- reading .metadata safely
def _allowed_globals() -> dict:
    """(module, name) -> object: everything a `.metadata` that DCP wrote may name."""
    import pathlib

    from torch.distributed.checkpoint import filesystem, metadata
    allowed = {("torch.distributed.checkpoint.metadata", n): getattr(metadata, n) for n in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")}
    allowed[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = filesystem._StorageInfo
    allowed[("torch", "Size")] = torch.Size
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout   # a name -> torch.layout
    for n in ("Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"):
        allowed[("pathlib", n)] = getattr(pathlib, n)   # StorageMeta.checkpoint_id
    for n in dir(torch):
        obj = getattr(torch, n, None)
        if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
            allowed[("torch", n)] = obj
    return allowed


class _Refused(Exception):
    """A global (or persistent id) outside what DCP's metadata may name."""


class _MetadataUnpickler(pickle.Unpickler):
    allowed: dict = {}

    def find_class(self, module, name):
        try:
            return self.allowed[(module, name)]
        except KeyError:
            raise _Refused(f"{module}.{name}") from None

    def persistent_load(self, pid):
        raise _Refused("a persistent id")


def read_metadata_safely(data: bytes, path) -> object:
    """The Metadata of a DCP folder from the bytes of its `.metadata`, rebuilt by a restricted
    unpickler and checked; a CheckpointError naming what was refused, never code run."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata
    if not _MetadataUnpickler.allowed:
        _MetadataUnpickler.allowed = _allowed_globals()
    refuse = (f"refusing to load the sharded checkpoint {path}: its .metadata {{}}; hasten did not write it this way, "
              "and loading it could run code from the folder. Load a checkpoint you made, or an earlier one")
    try:
        md = _MetadataUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise CheckpointError(refuse.format(f"names a Python object ({e}) that only running code could "
                                            "rebuild")) from None
    except Exception as e:   # truncated, garbled
        raise CheckpointError(f"cannot read the sharded checkpoint {path}: its .metadata is damaged "
                              f"({type(e).__name__}); load an earlier checkpoint") from None
    if type(md) is not Metadata or not isinstance(md.state_dict_metadata, dict) \
            or not isinstance(md.storage_data, dict):
        raise CheckpointError(refuse.format(f"holds a {type(md).__name__}, not DCP's Metadata"))
    for key, entry in md.state_dict_metadata.items():
        if type(entry) is not TensorStorageMetadata:   # DCP would torch.load a non-tensor entry with pickle
            raise CheckpointError(refuse.format(f"declares {str(key)[:80]!r} a {type(entry).__name__} (hasten's "
                                                "shards hold tensors only)"))
    for index, info in md.storage_data.items():
        if type(index) is not MetadataIndex or type(info) is not _StorageInfo:
            raise CheckpointError(refuse.format("has a storage entry of another kind"))
        if not (isinstance(info.relative_path, str) and _SHARD_FILE.match(info.relative_path)
                and type(info.offset) is int and type(info.length) is int and info.offset >= 0 and info.length >= 0):
            raise CheckpointError(refuse.format(f"points at {str(info.relative_path)[:80]!r}, not a shard file "
                                                "inside the folder"))
        if info.transform_descriptors:   # hasten writes no transforms (compression, ...)
            raise CheckpointError(refuse.format(f"asks for stream transforms {list(info.transform_descriptors)[:3]}"))
    return md


def _safe_reader_class():
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        """DCP's FileSystemReader with `.metadata` read by `read_metadata_safely`."""

        def read_metadata(self, *args, **kwargs):
            path = self._get_metadata_path(kwargs.get("rank"))
            try:
                with self.fs.create_stream(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise CheckpointError(f"cannot read the sharded checkpoint {self.path}: no readable .metadata "
                                      f"({e.strerror or e}); the folder is incomplete: load an earlier checkpoint") from e
            md = read_metadata_safely(data, self.path)
            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md
    return SafeReader


def safe_reader(path):
    """A DCP storage reader for the folder `path` that never unpickles anything but DCP's
    metadata. The metadata is read and checked once here, on this rank, so a refusal is
    hasten's one line before DCP starts (DCP would log it as a fall-back to per-rank metadata)."""
    reader = _safe_reader_class()(str(path))
    reader.read_metadata()
    return reader


def _read_shards(read, path):
    """Run a DCP read; its failure as one CheckpointError (DCP gathers each rank's exception into
    a CheckpointException, a BaseException: hasten's own refusal inside it comes out as it is)."""
    from torch.distributed.checkpoint.api import CheckpointException
    try:
        return read()
    except CheckpointError:
        raise
    except CheckpointException as e:
        inner = [exc for exc, _ in e.failures.values()]
        own = next((exc for exc in inner if isinstance(exc, CheckpointError)), None)
        if own is not None:
            raise own from None
        what = f"{type(inner[0]).__name__}: {first_line(inner[0])}" if inner else "a failure on another rank"
        raise CheckpointError(f"cannot read the shards of {path}: {what}") from None
    except Exception as e:
        raise CheckpointError(f"cannot read the shards of {path}: {type(e).__name__}: {first_line(e)}") from e


def split_tensors(obj, prefix: str = "") -> tuple[object, dict]:
    """`obj` with every tensor replaced by a placeholder naming its key, and the tensors by key."""
    tensors = {}

    def walk(o, path):
        if isinstance(o, torch.Tensor):
            tensors[path] = o
            return _MARK + path
        if isinstance(o, dict):
            return {k: walk(v, f"{path}/{k}") for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return type(o)(walk(v, f"{path}/{i}") for i, v in enumerate(o))
        return o
    return walk(obj, prefix), tensors


def join_tensors(skeleton, tensors: dict):
    """The inverse of split_tensors."""
    if isinstance(skeleton, str) and skeleton.startswith(_MARK):
        return tensors[skeleton[len(_MARK):]]
    if isinstance(skeleton, dict):
        return {k: join_tensors(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(join_tensors(v, tensors) for v in skeleton)
    return skeleton


def _rank() -> int:
    import torch.distributed as dist
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class ShardedCheckpointIO(CheckpointIO):
    """Writes sharded checkpoints (a `.dcp` folder) from every rank of a sharded run; reads
    both kinds (as CheckpointIO does)."""

    suffix = ".dcp"
    writes_folder = True
    gathers = False   # capture keeps the model's and optimizer's shards as they are

    def save(self, payload: dict, path: "str | os.PathLike") -> None:
        import torch.distributed.checkpoint as dcp
        path = Path(path)
        tmp = path.parent / f".{path.name}.partial.tmp"
        skeleton, tensors = split_tensors({"model": payload["model"], "optimizers": payload["optimizers"]})
        rest = {**payload, **skeleton, "sharded": True}
        main = _rank() == 0
        try:
            if main:
                path.parent.mkdir(parents=True, exist_ok=True)
                if tmp.exists():
                    shutil.rmtree(tmp)
            _barrier()
            dcp.save(tensors, checkpoint_id=str(tmp), no_dist=not _distributed())   # each rank writes its shards
            if main:
                atomic_write(tmp / REST, lambda f: torch.save(rest, f), error=CheckpointError)
                fsync_dir(tmp)
                old = path.parent / f".{path.name}.old.tmp"
                if path.exists():   # this run's own checkpoint of the same name (the callback checked)
                    os.replace(path, old)
                os.replace(tmp, path)
                fsync_dir(path.parent)
                if old.exists():
                    shutil.rmtree(old)
        except OSError as e:
            raise CheckpointError(f"cannot write the sharded checkpoint {path}: {e.strerror or e}") from e
        _barrier()   # no rank goes on before the checkpoint has its name


def load_sharded(model, optimizers, payload: dict) -> tuple[dict, list]:
    """The model's and optimizers' state from a sharded checkpoint, read into the tensors of
    the current run as they are sharded now (any world size, or none): state dicts for
    set_model_state_dict and set_optimizer_state_dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    target = {"model": get_model_state_dict(model), "optimizers": [get_optimizer_state_dict(model, o) for o in optimizers]}
    skeleton, tensors = split_tensors(target)
    stored = set(_marks({"model": payload["model"], "optimizers": payload["optimizers"]}))
    if stored != set(tensors):
        raise CheckpointError("the checkpoint's model or optimizer state does not match this run's: missing "
                              f"{sorted(set(tensors) - stored)[:3] or 'nothing'}, not in this run "
                              f"{sorted(stored - set(tensors))[:3] or 'nothing'}")
    path = payload["sharded_path"]
    _read_shards(lambda: dcp.load(tensors, storage_reader=safe_reader(path), no_dist=not _distributed()), path)
    loaded = join_tensors(skeleton, tensors)
    return loaded["model"], loaded["optimizers"]


def restore_tensors(state, payload: dict, meta: dict) -> None:
    """Read a sharded checkpoint's model and optimizer shards into the run's (resharded)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    check_optimizers(state, payload, meta)
    model_sd, optimizer_sds = load_sharded(state.model, state.optimizers, payload)
    set_model_state_dict(state.model, model_sd)
    for opt, sd in zip(state.optimizers, optimizer_sds):
        set_optimizer_state_dict(state.model, opt, sd)


def _marks(obj) -> list[str]:
    out = []
    if isinstance(obj, str) and obj.startswith(_MARK):
        out.append(obj[len(_MARK):])
    elif isinstance(obj, dict):
        for v in obj.values():
            out += _marks(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            out += _marks(v)
    return out


def _distributed() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def load_whole(path: "str | os.PathLike") -> dict:
    """A sharded checkpoint's payload with whole tensors (model state as a plain `state_dict`,
    optimizer state keyed by parameter names), read in one process without a model: what a
    whole checkpoint file of it holds (`export_whole`), and what `hasten compress` loads."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
    payload = load_rest(path)
    def read():
        with warnings.catch_warnings():   # one process, no process group: what this function is for
            warnings.filterwarnings("ignore", message="torch.distributed is unavailable or uninitialized")
            return _load_state_dict_from_keys(set(_marks({"m": payload["model"], "o": payload["optimizers"]})),
                                              storage_reader=safe_reader(path))
    tensors = _read_shards(read, path)
    whole = {k: v for k, v in payload.items() if k not in ("sharded", "sharded_path")}
    whole["model"], whole["optimizers"] = join_tensors(payload["model"], tensors), join_tensors(payload["optimizers"], tensors)
    return whole


def export_whole(path: "str | os.PathLike", out: "str | os.PathLike") -> str:
    """Write a sharded checkpoint as today's single file (`load_whole`), in one process,
    without a model: for inference, `hasten compress`, or runs without sharding."""
    CheckpointIO().save(load_whole(path), out)
    return str(out)


__all__ = ["ShardedCheckpointIO", "export_whole", "join_tensors", "load_rest", "load_sharded", "load_whole", "read_metadata_safely",
           "restore_tensors", "safe_reader", "split_tensors"]
