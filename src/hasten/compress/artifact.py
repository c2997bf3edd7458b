"""hasten artifacts: a compressed model as one file, loaded without running code.

An artifact is a `torch.save` file read back with `weights_only=True` (like every hasten
checkpoint) holding
- `format`: "hasten-artifact/1";
- `meta`: JSON text: the recipe the model was trained with, the config changes structured
  pruning made, the compression applied, the evaluation before and after, the code version;
- `weights`: the state dict. A weight with enough zeros is stored compressed: its non-zero
  values plus a bit mask (one bit per weight), so 50% sparsity takes about 53% of the dense
  bytes on disk; torchao's int8 tensors are stored as they are (they need torchao to load);
- `int8_static`: for int8-static, what makes the int8 graph this model's (`tensors`: its int8
  weights, scales, zero points and float biases, sparse ones packed like weights; `numbers`:
  the activations' scales and zero points), put back into the graph the recipe's model
  quantizes to when loaded; `weights` is then empty. Artifacts written before this held
  float weights and `calibration`, the batches to re-quantize from; they still load.

Written atomically: a crash leaves the previous file (or none), never half of one.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..checkpoint.format import read_meta, why_unreadable
from ..errors import CheckpointError
from ..files import atomic_write
from .quantize import require_torchao

FORMAT = "hasten-artifact/1"
_BITS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


def pack_sparse(t: torch.Tensor) -> dict | torch.Tensor:
    """A plain float or int8 tensor with zeros as {values, bits, shape}, when that is smaller."""
    if type(t) is not torch.Tensor or not (t.is_floating_point() or t.dtype == torch.int8) or t.numel() < 64:
        return t
    nz = t != 0
    n = int(nz.sum())
    if n * t.element_size() + (t.numel() + 7) // 8 >= t.numel() * t.element_size():
        return t
    flat = nz.reshape(-1)
    pad = (-flat.numel()) % 8
    bits = torch.cat([flat, flat.new_zeros(pad)]).view(-1, 8).to(torch.uint8)
    packed = (bits * _BITS).sum(dim=1).to(torch.uint8)
    return {"sparse_values": t.reshape(-1)[flat].clone(), "sparse_bits": packed, "shape": list(t.shape)}


def unpack_sparse(v) -> torch.Tensor:
    if not (isinstance(v, dict) and "sparse_values" in v):
        return v
    shape, values, packed = v["shape"], v["sparse_values"], v["sparse_bits"]
    numel = 1
    for s in shape:
        numel *= s
    bits = ((packed.unsqueeze(1) & _BITS) != 0).reshape(-1)[:numel]
    if int(bits.sum()) != values.numel():
        raise CheckpointError("artifact: a sparse weight's mask and values disagree (the file is corrupt)")
    out = torch.zeros(numel, dtype=values.dtype)
    out[bits] = values
    return out.reshape(shape)


def _packed(tensors: dict) -> dict:
    return {k: pack_sparse(v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in tensors.items()}


def save_artifact(path: "str | os.PathLike", state_dict: dict, meta: dict, calibration=None,
                  static: dict | None = None) -> int:
    """Write an artifact atomically; returns its size in bytes. `static`: an int8-static graph's
    state (quantize.static_state); `calibration`: the older form's batches."""
    path = Path(path)
    payload = {"format": FORMAT, "meta": json.dumps(meta, default=str), "weights": _packed(state_dict)}
    if static is not None:
        payload["int8_static"] = {"tensors": _packed(static["tensors"]), "numbers": static["numbers"]}
    if calibration is not None:
        payload["calibration"] = [c.detach().cpu() for c in calibration]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: torch.save(payload, f), error=CheckpointError)
    return path.stat().st_size


def require_artifact(path: "str | os.PathLike") -> Path:
    """The path as a Path; a one-line CheckpointError, naming the fix, when no file is there."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no artifact at {path}: give the file `hasten compress` wrote (the 'artifact:' line it printed)")
    return path


def read_artifact(path: "str | os.PathLike") -> tuple[dict, dict, dict | None]:
    """(state dict, meta, int8-static state) of an artifact; the last is None unless int8-static:
    {"tensors", "numbers"}, or {"calibration": batches} for an artifact of the older form. A
    one-line CheckpointError for a missing, corrupt or foreign file."""
    path = require_artifact(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        msg = str(e)
        if "torchao" in msg:
            try:
                require_torchao()
            except ImportError:
                raise CheckpointError(f"{path} holds torchao int8 weights: pip install 'hasten[compress]' "
                                      "(torchao) to load it") from None
            try:   # torchao registers its tensor types as safe once imported
                payload = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e2:
                raise CheckpointError(f"cannot read artifact {path}: {why_unreadable(e2)}") from e2
        else:
            raise CheckpointError(f"cannot read artifact {path}: {why_unreadable(e)}, so it is corrupt, truncated or "
                                  "not a hasten artifact (hasten loads tensors and plain data only, never code from a "
                                  "file)") from e
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        if isinstance(payload, dict) and "model" in payload and "meta" in payload:
            raise CheckpointError(f"{path} is a training checkpoint, not an artifact: make one with "
                                  f"`hasten compress {path} ...`")
        raise CheckpointError(f"{path} is not a hasten artifact ({FORMAT})")
    meta = read_meta(payload, path, "artifact")
    if not isinstance(meta.get("recipe"), dict):
        raise CheckpointError(f"artifact {path}: its metadata holds no recipe (it records what the model was trained "
                              "with); the file is damaged or was not written by hasten compress")
    try:
        weights = {k: unpack_sparse(v) for k, v in payload["weights"].items()}
        static = None
        if "int8_static" in payload:
            static = {"tensors": {k: unpack_sparse(v) for k, v in payload["int8_static"]["tensors"].items()},
                      "numbers": list(payload["int8_static"]["numbers"])}
        elif payload.get("calibration") is not None:
            static = {"calibration": payload["calibration"]}
    except (KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"artifact {path} is damaged: {type(e).__name__}: {e}") from e
    return weights, meta, static


__all__ = ["FORMAT", "pack_sparse", "read_artifact", "save_artifact", "unpack_sparse"]
