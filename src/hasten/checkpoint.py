"""Checkpoints: atomic save, safe load, autoresume discovery.

A checkpoint holds model, optimizers, schedulers, grad scaler, algorithm and callback
state, the timestamp and every random number generator. Tensors are saved with
`torch.save` and read back with `weights_only=True`, so loading never runs code from the
file; everything else (counters, numpy and Python RNG states, metadata) goes in a JSON
string inside it.

All file I/O passes through a `CheckpointIO` (one seam): the default writes one file per
checkpoint; a sharded implementation (torch.distributed.checkpoint) can replace it.
"""
from __future__ import annotations

import json
import os
import random
import re
import warnings
from pathlib import Path

import numpy as np
import torch

from . import __version__
from .errors import CheckpointError
from .files import atomic_write, os_error_message
from .utils import gather_whole, local_tensors

FORMAT = 1
_NAME = re.compile(r"^ep(\d+)-ba(\d+)\.(pt|dcp)$")


class CheckpointIO:
    """Writes and reads one checkpoint file. Writes are atomic: temporary file, fsync, rename;
    a failed write (disk full, a signal) leaves the previous file as it was."""

    suffix = ".pt"   # what this IO writes: a file NAME.pt (a sharded IO writes a folder)
    gathers = True   # a sharded model's state is gathered whole before it is written (rank 0 writes)

    def save(self, payload: dict, path: "str | os.PathLike") -> None:
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CheckpointError(os_error_message(e, path.parent, "creating the checkpoint folder")) from e
        atomic_write(path, lambda f: torch.save(payload, f), error=CheckpointError)

    def load(self, path: "str | os.PathLike") -> dict:
        path = Path(path)
        if path.is_dir():   # a sharded checkpoint (hasten.checkpoint_sharded): any IO reads both kinds
            from .checkpoint_sharded import load_rest
            return load_rest(path)
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint at {path}")
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(
                f"cannot read checkpoint {path}: {type(e).__name__}: {_first_line(e)}. The file is corrupt, "
                "truncated or not a hasten checkpoint; objects that would need code to be run "
                "are refused. Load an earlier checkpoint from the same folder.") from e
        if not isinstance(payload, dict) or payload.get("format") != FORMAT or "meta" not in payload:
            raise CheckpointError(f"{path} is not a hasten checkpoint (format {FORMAT})")
        return payload


def _first_line(e: Exception) -> str:
    return next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "").rstrip(".")


# ---------------------------------------------------------------------------- capture / restore
def _rng_state() -> tuple[dict, dict]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.cuda.get_rng_state_all()
    np_state = np.random.get_state()
    py_state = random.getstate()
    meta = {"numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
            "python": [py_state[0], list(py_state[1]), py_state[2]]}
    return tensors, meta


def _set_rng_state(tensors: dict, meta: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors["cuda"])
    n = meta["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    p = meta["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


def _keyed(objs) -> dict:
    """Name objects by class, with a suffix for repeats: {'EMA': ema, 'Checkpoint': cb, ...}."""
    out, seen = {}, {}
    for o in objs:
        base = getattr(o, "name", None) or type(o).__name__
        if not isinstance(base, str):
            base = type(o).__name__
        n = seen.get(base, 0)
        seen[base] = n + 1
        out[base if n == 0 else f"{base}.{n}"] = o
    return out


def _sharded(state) -> bool:
    world = getattr(state.runtime, "world", None)
    return world is not None and world.sharded


def _check_finite_weights(model: torch.nn.Module) -> None:
    params = local_tensors([p.detach() for p in model.parameters() if p.is_floating_point()])
    params = [p for p in params if p.numel()]
    if params and not bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
        bad = [n for n, p in model.named_parameters() if p.is_floating_point() and not torch.isfinite(local_tensors([p])[0]).all()]
        raise CheckpointError(f"refusing to write a checkpoint: non-finite values in {bad[:5]}")


def capture(state, extra_meta: dict | None = None, whole: bool = True) -> dict:
    """Everything needed to resume, as a payload for CheckpointIO. With a sharded model (FSDP)
    a collective that every rank calls: the model and the optimizers' state are gathered
    whole, as ordinary tensors, on rank 0 (`optimizer_style` 'names': their state keyed by
    parameter names), so the file loads at any world size and into an unsharded model. With
    `whole=False` (a sharded CheckpointIO) the model's and optimizer's shards are kept as they
    are, each rank holding its own."""
    _check_finite_weights(state.model)
    rng_tensors, rng_meta = _rng_state()
    sharded = _sharded(state)
    meta = {"hasten_version": __version__, "timestamp": state.timestamp.state_dict(),
            "rng": rng_meta, "last_checkpoint": state.last_checkpoint,
            "optimizers": [type(o).__name__ for o in state.optimizers],
            "optimizer_style": "names" if sharded else "ids"}
    if extra_meta:
        meta.update(extra_meta)
    if sharded and not whole:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
        model = get_model_state_dict(state.model)
        optimizers = [get_optimizer_state_dict(state.model, o) for o in state.optimizers]
    elif sharded:
        from . import fsdp
        model = fsdp.model_state(state.model)
        optimizers = [fsdp.optimizer_state(state.model, o) for o in state.optimizers]
    else:
        model, optimizers = state.model.state_dict(), [o.state_dict() for o in state.optimizers]
    return {
        "format": FORMAT,
        "model": model,
        "optimizers": optimizers,
        "schedulers": [s.state_dict() if hasattr(s, "state_dict") else {} for s in state.schedulers],
        "scaler": state.scaler.state_dict() if state.scaler is not None else {},
        "algorithms": {k: gather_whole(a.state_dict()) for k, a in _keyed(state.algorithms).items()},
        "callbacks": {k: c.state_dict() for k, c in _keyed(state.callbacks).items()},
        "rng": rng_tensors,
        "meta": json.dumps(meta),
    }


def save(state, path: "str | os.PathLike", io: CheckpointIO, extra_meta: dict | None = None,
         write: bool = True) -> str:
    """Write a checkpoint of `state` to `path` and record it as the last good one. Raises
    NonFiniteLossError first if a loss since the last check was NaN/Inf: bad weights are
    never saved. With a sharded model every rank calls it (the state is gathered) and only
    the one with `write` (rank 0) writes the file."""
    state.read_train_loss(reset=False)
    gathers = getattr(io, "gathers", True)
    payload = capture(state, extra_meta, whole=gathers)
    if write or not gathers:   # a sharded IO's save is a collective: every rank writes its shards
        io.save(payload, path)
    state.last_checkpoint = str(path)
    return str(path)


def restore(state, payload: dict, strict: bool = True) -> dict:
    """Load a payload into the state; returns the metadata."""
    meta = json.loads(payload["meta"])
    sharded, by_names = _sharded(state), meta.get("optimizer_style") == "names"
    if payload.get("sharded_path"):   # a sharded checkpoint: read its shards into this run's tensors
        _restore_sharded(state, payload, meta)
        return _restore_rest(state, payload, meta)
    try:
        if sharded:   # whole tensors into the shards (every rank read the same file)
            from . import fsdp
            fsdp.load_model_state(state.model, payload["model"])
        else:
            state.model.load_state_dict(payload["model"], strict=strict)
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointError(f"the checkpoint's model does not match this model: {_first_line(e)}") from e
    if sharded and not by_names:
        raise CheckpointError("this checkpoint was written without sharding (optimizer state keyed by position); "
                              "resume it with trainer.parallelism=ddp or none, or start a sharded run from its "
                              "weights alone")
    _check_optimizers(state, payload, meta)
    saved_types = meta.get("optimizers")   # absent in checkpoints written before hasten recorded them
    for i, (opt, sd) in enumerate(zip(state.optimizers, payload["optimizers"])):
        mine = type(opt).__name__
        try:
            if by_names:   # written by a sharded run: state keyed by parameter names
                from . import fsdp
                fsdp.load_optimizer_state(state.model, opt, sd)
            else:
                opt.load_state_dict(sd)
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(f"the checkpoint's state for optimizer {i} ({saved_types[i] if saved_types else '?'}) "
                                  f"does not fit this run's {mine}: {e}") from e
    return _restore_rest(state, payload, meta)


def _check_optimizers(state, payload: dict, meta: dict) -> None:
    """The checkpoint holds as many optimizers as the run, of the same classes."""
    if len(payload["optimizers"]) != len(state.optimizers):
        raise CheckpointError(f"the checkpoint has {len(payload['optimizers'])} optimizers, "
                              f"this trainer {len(state.optimizers)}")
    saved_types = meta.get("optimizers")   # absent in checkpoints written before hasten recorded them
    for i, opt in enumerate(state.optimizers):
        if saved_types is not None and saved_types[i] != type(opt).__name__:
            raise CheckpointError(f"the checkpoint's optimizer {i} is {saved_types[i]}, this run's is "
                                  f"{type(opt).__name__}: its state cannot be loaded; use the optimizer the "
                                  "checkpoint was trained with")


def _restore_sharded(state, payload: dict, meta: dict) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    from .checkpoint_sharded import load_sharded
    _check_optimizers(state, payload, meta)
    model_sd, optimizer_sds = load_sharded(state.model, state.optimizers, payload)
    set_model_state_dict(state.model, model_sd)
    for opt, sd in zip(state.optimizers, optimizer_sds):
        set_optimizer_state_dict(state.model, opt, sd)


def _restore_rest(state, payload: dict, meta: dict) -> dict:
    """Schedulers, scaler, algorithms, callbacks, the clock and the generators."""
    for sch, sd in zip(state.schedulers, payload["schedulers"]):
        if hasattr(sch, "load_state_dict") and sd:
            sch.load_state_dict(sd)
    if state.scaler is not None and payload["scaler"]:
        state.scaler.load_state_dict(payload["scaler"])
    for group, objs in (("algorithms", state.algorithms), ("callbacks", state.callbacks)):
        saved = payload[group]
        for key, obj in _keyed(objs).items():
            if key in saved:
                obj.load_state_dict(saved[key])
            elif obj.state_dict():
                warnings.warn(f"checkpoint has no state for {group[:-1]} {key}; it starts fresh")
    state.timestamp.load_state_dict(meta["timestamp"])
    state.checked_batch = state.timestamp.batch
    _set_rng_state(payload["rng"], meta["rng"])
    return meta


# ---------------------------------------------------------------------------- discovery
def checkpoint_name(state) -> str:
    return f"ep{state.timestamp.epoch}-ba{state.timestamp.batch}.pt"


def list_checkpoints(folder: "str | os.PathLike") -> list[Path]:
    """Checkpoints in a folder, oldest first (by batch count)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = _NAME.match(p.name)
        if m and not p.is_symlink() and (p.is_file() if m.group(3) == "pt" else p.is_dir()):   # .dcp: a folder
            found.append((int(m.group(2)), p))
    return [p for _, p in sorted(found)]


def load_latest(folder: "str | os.PathLike", io: CheckpointIO | None = None) -> tuple[Path, dict] | None:
    """(path, payload) of the newest checkpoint in `folder` that loads; unreadable ones are
    skipped with a warning."""
    io = io or CheckpointIO()
    for p in reversed(list_checkpoints(folder)):
        try:
            return p, io.load(p)
        except CheckpointError as e:
            warnings.warn(f"skipping unreadable checkpoint: {e}")
    return None


def find_latest(folder: "str | os.PathLike", io: CheckpointIO | None = None) -> Path | None:
    """The newest checkpoint in `folder` that loads."""
    found = load_latest(folder, io)
    return found[0] if found else None
