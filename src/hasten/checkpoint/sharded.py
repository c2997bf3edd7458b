"""Sharded checkpoints: torch.distributed.checkpoint (DCP) behind the CheckpointIO seam.

A sharded checkpoint is a folder `epE-baB.dcp`: every rank writes its shards of the model and
optimizer state through DCP (no rank gathers the model), and rank 0 adds `rest.pt`, which
holds everything else of the payload (the clock, random number generator states, schedulers,
algorithm and callback state, metadata) with each tensor of the model and optimizer state
replaced by its key in the DCP folder. DCP's part holds tensors only and `rest.pt` loads with
`weights_only=True`, so loading never runs code from the checkpoint.

Atomic like a single file: the folder is written under a temporary name (`.epE-baB.dcp.partial.tmp`,
which checkpoint folders clear at their next start) and renamed once every rank has written
its part, so a kill during a save leaves the previous checkpoint as it was.

Loading reshards: the tensors are read into the current run's model and optimizer state as
they are sharded now (any world size, or none), so a checkpoint of two processes resumes
under one and the other way round. `export_whole` turns one into today's single file.
"""
from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import torch

from ..errors import CheckpointError, first_line
from ..files import atomic_write, fsync_dir
from .format import REST, check_optimizers, load_rest
from .whole import CheckpointIO

_MARK = "__dcp__:"   # a placeholder in rest.pt: the tensor is in the DCP folder under this key


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
    try:
        dcp.load(tensors, checkpoint_id=payload["sharded_path"], no_dist=not _distributed())
    except Exception as e:
        raise CheckpointError(f"cannot read the shards of {payload['sharded_path']}: {type(e).__name__}: "
                              f"{first_line(e)}") from e
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


def export_whole(path: "str | os.PathLike", out: "str | os.PathLike") -> str:
    """Write a sharded checkpoint as today's single file (whole tensors; model state as a
    plain `state_dict`, optimizer state keyed by parameter names), in one process, without a
    model: for inference, `hasten compress`, or runs without sharding."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
    payload = load_rest(path)
    try:
        with warnings.catch_warnings():   # one process, no process group: what this function is for
            warnings.filterwarnings("ignore", message="torch.distributed is unavailable or uninitialized")
            tensors = _load_state_dict_from_keys(set(_marks({"m": payload["model"], "o": payload["optimizers"]})),
                                                 storage_reader=FileSystemReader(str(path)))
    except Exception as e:
        raise CheckpointError(f"cannot read the shards of {path}: {type(e).__name__}: {first_line(e)}") from e
    whole = {k: v for k, v in payload.items() if k not in ("sharded", "sharded_path")}
    whole["model"], whole["optimizers"] = join_tensors(payload["model"], tensors), join_tensors(payload["optimizers"], tensors)
    CheckpointIO().save(whole, out)
    return str(out)


__all__ = ["ShardedCheckpointIO", "export_whole", "join_tensors", "load_rest", "load_sharded", "restore_tensors",
           "split_tensors"]
