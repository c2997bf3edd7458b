"""What a checkpoint holds, and how a training state goes into one and comes back.

A checkpoint holds the model, optimizers, schedulers, grad scaler, algorithm and callback
state, the timestamp and every random number generator. Tensors are saved with `torch.save`
and read back with `weights_only=True`, so loading never runs code from the file; everything
else (counters, numpy and Python RNG states, metadata) goes in a JSON string inside it.

Two layouts, one payload: a whole checkpoint is one file `epE-baB.pt` (hasten.checkpoint.whole);
a sharded one is a folder `epE-baB.dcp` whose model and optimizer tensors are written by every
rank through torch.distributed.checkpoint and whose rest is `rest.pt` (hasten.checkpoint.sharded).
This module knows the payload and the names; it writes nothing and imports neither writer.
"""
from __future__ import annotations

import json
import random
import re
import warnings
from pathlib import Path

import numpy as np
import torch

from ..version import __version__
from ..distributed import fsdp
from ..data.resumable import data_identity, keeps_state, plain_state
from ..distributed.tensors import gather_whole, local_tensors
from ..core.time import Timestamp
from ..errors import CheckpointError, first_line

FORMAT = 1
REST = "rest.pt"          # a sharded checkpoint's payload without its model and optimizer tensors
NAME = re.compile(r"^ep(\d+)-ba(\d+)\.(pt|dcp)$")


# ---------------------------------------------------------------------------- names
def checkpoint_name(state) -> str:
    return f"ep{state.timestamp.epoch}-ba{state.timestamp.batch}.pt"


def list_checkpoints(folder) -> list[Path]:
    """Checkpoints in a folder, oldest first (by batch count)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = NAME.match(p.name)
        if m and not p.is_symlink() and (p.is_file() if m.group(3) == "pt" else p.is_dir()):   # .dcp: a folder
            found.append((int(m.group(2)), p))
    return [p for _, p in sorted(found)]


# ---------------------------------------------------------------------------- reading
class NewerFormatError(CheckpointError):
    """A checkpoint written by a newer hasten: not damaged, and not to be skipped or replaced."""


def check_payload(payload, path, sharded: bool = False) -> dict:
    """The payload read from `path`, if it is one of this format; else a CheckpointError (a
    NewerFormatError when a newer hasten wrote it)."""
    what = "a hasten sharded checkpoint" if sharded else "a hasten checkpoint"
    found = payload.get("format") if isinstance(payload, dict) else None
    if type(found) is int and found > FORMAT and "meta" in payload:
        raise NewerFormatError(f"{path} was written by a newer hasten (checkpoint format {found}; this one reads format "
                               f"{FORMAT}): upgrade hasten to resume or load it")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or "meta" not in payload \
            or (sharded and not payload.get("sharded")):
        raise CheckpointError(f"{path} is not {what} (format {FORMAT})")
    read_meta(payload, path)   # checked when read, not where a field is first used
    return payload


def read_meta(payload: dict, path, what: str = "checkpoint") -> dict:
    """A checkpoint's (or an artifact's) metadata, checked against what hasten writes: a
    mapping; its timestamp a mapping of counts (hasten.core.time.Timestamp); rng a mapping;
    optimizers a list of names. A one-line CheckpointError says what was found instead."""
    again = ("make it again with `hasten compress RUN`" if what == "artifact"
             else "resume from an earlier checkpoint of the same folder")
    try:
        meta = json.loads(payload["meta"])
    except RecursionError:
        raise CheckpointError(f"{what} {path}: its metadata is nested deeper than anything hasten writes (a damaged or "
                              f"crafted file); {again}") from None
    except (KeyError, TypeError, ValueError) as e:
        found = "holds no metadata" if isinstance(e, KeyError) else "has metadata that is not JSON"
        raise CheckpointError(f"{what} {path} {found}: the file is damaged or was not written by hasten; {again}") from None
    problem = None
    if not isinstance(meta, dict):
        problem = f"it is {type(meta).__name__}, not a mapping"
    elif "timestamp" in meta and Timestamp.problem(meta["timestamp"]):
        problem = Timestamp.problem(meta["timestamp"])
        problem = f"its timestamp {problem}"
    elif "rng" in meta and not isinstance(meta["rng"], dict):
        problem = "its rng state is not a mapping"
    elif "optimizers" in meta and not (isinstance(meta["optimizers"], list)
                                       and all(isinstance(o, str) for o in meta["optimizers"])):
        problem = "its optimizers are not a list of names"
    if problem:
        raise CheckpointError(f"{what} {path}: its metadata does not fit what hasten writes ({problem}); the file is "
                              "damaged or was not written by hasten")
    return meta


def why_unreadable(e: BaseException) -> str:
    """torch.load's failure in a few words. A refused object is named; torch's advice to load
    with weights_only=False is left out, since that runs code from the file."""
    text = str(e)
    if "Weights only load failed" in text:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        if found:
            return f"it holds a Python object ({found.group(1)}) that only running code from the file could rebuild"
        return "it is not a file torch.save wrote"
    if "central directory" in text or "zip archive" in text:
        return "it is not a whole torch.save file (truncated or damaged)"
    return f"{type(e).__name__}: {first_line(e)}"


def load_rest(path) -> dict:
    """A sharded checkpoint's payload, its model and optimizer tensors still placeholders
    (`hasten.checkpoint.sharded.restore_tensors` reads them into the run's model)."""
    path = Path(path)
    try:
        payload = torch.load(path / REST, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {why_unreadable(e)}. The folder is "
                              "incomplete, corrupt or not a hasten checkpoint; load an earlier checkpoint") from e
    payload = check_payload(payload, path, sharded=True)
    payload["sharded_path"] = str(path)
    return payload


# ---------------------------------------------------------------------------- capture
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


def keyed(objs) -> dict:
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


def _check_finite_weights(model: torch.nn.Module) -> None:
    params = local_tensors([p.detach() for p in model.parameters() if p.is_floating_point()])
    params = [p for p in params if p.numel()]
    if params and not bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
        bad = [n for n, p in model.named_parameters() if p.is_floating_point() and not torch.isfinite(local_tensors([p])[0]).all()]
        raise CheckpointError(f"refusing to write a checkpoint: non-finite values in {bad[:5]}")


def capture(state, extra_meta: dict | None = None, whole: bool = True) -> dict:
    """Everything needed to resume, as a payload for a CheckpointIO. With a sharded model (FSDP)
    a collective that every rank calls: the model and the optimizers' state are gathered
    whole, as ordinary tensors, on rank 0 (`optimizer_style` 'names': their state keyed by
    parameter names), so the file loads at any world size and into an unsharded model. With
    `whole=False` (a sharded CheckpointIO) the model's and optimizer's shards are kept as they
    are, each rank holding its own."""
    _check_finite_weights(state.model)
    rng_tensors, rng_meta = _rng_state()
    sharded = state.runtime.world.sharded
    meta = {"hasten_version": __version__, "timestamp": state.timestamp.state_dict(),
            "rng": rng_meta, "last_checkpoint": state.last_checkpoint,
            "optimizers": [type(o).__name__ for o in state.optimizers],
            "optimizer_style": "names" if sharded else "ids", "microbatch": state.microbatch}
    data = data_identity(state.train_dataloader)
    if data is not None:
        meta["data"] = data
    if extra_meta:
        meta.update(extra_meta)
    if sharded and not whole:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
        model = get_model_state_dict(state.model)
        optimizers = [get_optimizer_state_dict(state.model, o) for o in state.optimizers]
    elif sharded:
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
        "algorithms": {k: gather_whole(a.state_dict()) for k, a in keyed(state.algorithms).items()},
        "callbacks": {k: c.state_dict() for k, c in keyed(state.callbacks).items()},
        "rng": rng_tensors,
        "loaders": loader_states(state),
        "meta": json.dumps(meta),
    }


def loader_states(state) -> dict:
    """{"train": [state of each rank's training loader]} for a loader that keeps its own state
    (hasten.data.resumable.keeps_state); {} for one hasten resumes from the clock. Under data
    parallelism every rank's state is gathered (every rank calls this, as it calls capture)."""
    loader = state.train_dataloader
    if not keeps_state(loader):
        return {}
    own = loader.state_dict()
    if not plain_state(own):
        warnings.warn(f"the training loader's state ({type(loader).__name__}.state_dict()) holds objects a "
                      "checkpoint cannot load without running code; it is not saved, and a resume loads and drops "
                      "the batches it skips")
        own = None
    world = state.runtime.world
    if world.size > 1:
        import torch.distributed as dist   # (a process group exists whenever size > 1)
        gathered = [None] * world.size
        dist.all_gather_object(gathered, own)
    else:
        gathered = [own]
    return {"train": gathered} if all(s is not None for s in gathered) else {}


def restore_loader(state, payload: dict) -> None:
    """Give the training loader back its state (this rank's); say so when it cannot be."""
    loader = state.train_dataloader
    state.loader_restored = False
    if not keeps_state(loader):
        return
    saved = (payload.get("loaders") or {}).get("train")
    world = state.runtime.world
    if not saved:
        warnings.warn(f"the checkpoint holds no state of the training loader ({type(loader).__name__}); resuming "
                      f"loads and drops the {state.timestamp.batch_in_epoch} batches of this epoch it already trained on")
        return
    if len(saved) != world.size:
        warnings.warn(f"the training loader's state was saved by {len(saved)} process(es), this run has {world.size}: "
                      f"a loader's state is per process, so it loads and drops the {state.timestamp.batch_in_epoch} "
                      "batches of this epoch it already trained on")
        return
    loader.load_state_dict(saved[world.rank])
    state.loader_restored = True


# ---------------------------------------------------------------------------- restore
def check_data(state, meta: dict, path) -> None:
    """A checkpoint that recorded what its training data proved to be (a prepared source's
    manifest) resumes only on the same data: the order and position it saved mean nothing on
    other rows."""
    saved, now = meta.get("data"), data_identity(state.train_dataloader)
    if not isinstance(saved, dict) or now is None:
        return
    keys = [k for k in saved if k != "source"]   # the same bytes may move (a folder copied to a store)
    if any(saved.get(k) != now.get(k) for k in keys):
        source, ident = now.get("source"), f"manifest {str(now.get('manifest'))[:12]}..."
        now_is = (f"{source} now holds other data ({ident})" if source == saved.get("source")
                  else f"this run reads {source}, other data ({ident})")
        raise CheckpointError(
            f"{path} was trained on {saved.get('source')} (split {saved.get('split')}, manifest "
            f"{str(saved.get('manifest'))[:12]}...); {now_is}: a resume continues only on the data it was trained "
            "on; restore that source, or start a new run from its weights (trainer.load_path with "
            "trainer.load_mode=weights)")


def check_optimizers(state, payload: dict, meta: dict) -> None:
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


def model_mismatch(model: torch.nn.Module, saved: dict) -> str | None:
    """What keeps a saved state dict from loading into `model` (keys missing on either side,
    tensors of other shapes), in one line; None when it fits."""
    mine = model.state_dict()
    if not isinstance(saved, dict):
        return "the checkpoint holds no model state dict"
    missing = [k for k in mine if k not in saved]
    extra = [k for k in saved if k not in mine]
    shapes = [f"{k} is {list(saved[k].shape)} there and {list(v.shape)} here" for k, v in mine.items()
              if k in saved and isinstance(saved[k], torch.Tensor) and isinstance(v, torch.Tensor)
              and saved[k].shape != v.shape]
    parts = []
    for what, items in (("shapes differ", shapes), ("missing from the checkpoint", missing),
                        ("not in this model", extra)):
        if items:
            parts.append(f"{what}: {', '.join(items[:2])}" + (f" (and {len(items) - 2} more)" if len(items) > 2 else ""))
    return "; ".join(parts) or None


def load_weights(model: torch.nn.Module, saved: dict, check=None) -> tuple[list[str], list[str], list[str]]:
    """Copy into `model` the saved tensors that fit by name and shape (a pre-trained encoder
    into a classifier, say); (loaded, left fresh, unused) names. `check(names)` sees the names
    that fit before anything is copied, and may refuse (check_loaded_share)."""
    mine = model.state_dict()
    if not isinstance(saved, dict):
        raise CheckpointError("the checkpoint holds no model state dict")
    fits = {k: v for k, v in saved.items() if k in mine and isinstance(v, torch.Tensor) and v.shape == mine[k].shape}
    if check is not None:
        check(sorted(fits))
    model.load_state_dict(fits, strict=False)
    return sorted(fits), sorted(k for k in mine if k not in fits), sorted(k for k in saved if k not in fits)


def loaded_share(model: torch.nn.Module, loaded: "list[str]") -> tuple[int, int, float]:
    """(tensors loaded, tensors of the model, share of the model's parameter elements loaded),
    each stored tensor counted once (tied weights share one storage)."""
    mine = model.state_dict()
    seen, total, got = set(), 0, 0
    for name, t in mine.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)) if t.numel() else (name,)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel()
        got += t.numel() if name in loaded else 0
    return len([k for k in loaded if k in mine]), len(mine), (got / total if total else 1.0)


def check_loaded_share(model: torch.nn.Module, loaded: "list[str]", path, least: float) -> None:
    """Refuse a weights-only start that filled less than `least` of the model (trainer.load_min_share),
    in one line saying how much it matched."""
    n, of, share = loaded_share(model, loaded)
    if n == 0 or share < least:
        raise CheckpointError(
            f"{path}: {n} of this model's {of} tensors fit it by name and shape ({share:.0%} of its parameters"
            + (f", less than trainer.load_min_share={least:g}" if n else "") + "): is it the weights of the model you "
            "mean to start from?" + (f" To start from this partial load on purpose, set trainer.load_min_share="
                                     f"{max(0.0, int(share * 100) / 100):g}" if n else ""))


MODEL_MISMATCH_FIX = ("the model built now is not the one the checkpoint was trained with: use the model settings "
                      "it was trained with (for a run folder, its recipe.yaml without model overrides)")


def restore_whole_tensors(state, payload: dict, meta: dict, strict: bool = True) -> None:
    """The model's and optimizers' state from a whole checkpoint (into a sharded model too:
    every rank read the same file)."""
    sharded, by_names = state.runtime.world.sharded, meta.get("optimizer_style") == "names"
    problem = model_mismatch(state.model, payload["model"]) if strict and not sharded else None
    if problem:
        raise CheckpointError(f"the checkpoint's model does not match this model ({problem}); {MODEL_MISMATCH_FIX}")
    try:
        if sharded:
            fsdp.load_model_state(state.model, payload["model"])
        else:
            state.model.load_state_dict(payload["model"], strict=strict)
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointError(f"the checkpoint's model does not match this model: {first_line(e)}") from e
    if sharded and not by_names:
        raise CheckpointError("this checkpoint was written without sharding (optimizer state keyed by position); "
                              "resume it with trainer.parallelism=ddp or none, or start a sharded run from its "
                              "weights alone")
    check_optimizers(state, payload, meta)
    saved_types = meta.get("optimizers")   # absent in checkpoints written before hasten recorded them
    for i, (opt, sd) in enumerate(zip(state.optimizers, payload["optimizers"])):
        try:
            if by_names:   # written by a sharded run: state keyed by parameter names
                fsdp.load_optimizer_state(state.model, opt, sd)
            else:
                opt.load_state_dict(sd)
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(f"the checkpoint's state for optimizer {i} ({saved_types[i] if saved_types else '?'}) "
                                  f"does not fit this run's {type(opt).__name__}: {e}") from e


def restore_rest(state, payload: dict, meta: dict) -> dict:
    """Schedulers, scaler, algorithms, callbacks, the clock and the generators."""
    for sch, sd in zip(state.schedulers, payload["schedulers"]):
        if hasattr(sch, "load_state_dict") and sd:
            sch.load_state_dict(sd)
    if state.scaler is not None and payload["scaler"]:
        state.scaler.load_state_dict(payload["scaler"])
    for group, objs in (("algorithms", state.algorithms), ("callbacks", state.callbacks)):
        saved = payload[group]
        for key, obj in keyed(objs).items():
            if key in saved:
                obj.load_state_dict(saved[key])
            elif obj.state_dict():
                warnings.warn(f"checkpoint has no state for {group[:-1]} {key}; it starts fresh")
    state.timestamp.load_state_dict(meta["timestamp"])
    state.checked_batch = state.timestamp.batch
    restore_loader(state, payload)
    if state.microbatch_auto and meta.get("microbatch") is not None:
        state.microbatch = min(state.microbatch, meta["microbatch"])   # microbatch=auto: the size that fitted
    _set_rng_state(payload["rng"], meta["rng"])
    return meta
