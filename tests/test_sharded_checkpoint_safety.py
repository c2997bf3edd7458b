"""Sharded (.dcp) checkpoints never run code: DCP's `.metadata` is a pickle, and a crafted one
is refused by hasten's restricted reader on every path that reads shards (resume, load_path,
export_whole for `hasten compress`), before anything in it runs."""
import os
import pickle
import shutil

import pytest
import torch

from hasten import Trainer, make_runtime
from hasten.checkpoint import CheckpointError
from hasten.checkpoint.sharded import export_whole, read_metadata_safely

from tiny import loader, mlp

MARK = "hasten-dcp-pwned"


class Payload:
    """Unpickling this runs a command (what an attacker's .metadata would do)."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


class Outsider:
    """A class outside the allowed set, harmless in itself."""


@pytest.fixture
def fsdp():
    """A sharded runtime in this process (FSDP over a mesh of one)."""
    runtime = make_runtime(device="cpu", parallelism="fsdp")
    yield runtime
    runtime.close()


@pytest.fixture
def dcp_run(tmp_path, fsdp):
    """A folder of sharded checkpoints written by an FSDP run."""
    save = tmp_path / "ckpt"
    Trainer(mlp(), loader(), max_duration="4ba", runtime=fsdp, save_folder=str(save), save_interval="2ba").fit()
    assert (save / "ep0-ba4.dcp" / ".metadata").is_file()
    return save


def _craft(folder, obj):
    (folder / ".metadata").write_bytes(pickle.dumps(obj))


def _loads(runtime, **kw):
    return Trainer(mlp(), loader(), max_duration="6ba", runtime=runtime, **kw)


def test_an_untouched_sharded_checkpoint_resumes_through_the_safe_reader(dcp_run, fsdp):
    tr = _loads(fsdp, load_path=str(dcp_run / "ep0-ba4.dcp"))
    assert tr.state.timestamp.batch == 4
    whole = export_whole(dcp_run / "ep0-ba4.dcp", dcp_run.parent / "whole.pt")
    assert torch.load(whole, weights_only=True)["model"].keys() == mlp().state_dict().keys()


@pytest.mark.parametrize("entry", ["load_path", "autoresume", "export_whole"])
def test_a_reduce_payload_in_the_metadata_is_refused_and_never_runs(dcp_run, fsdp, tmp_path, entry):
    target = tmp_path / MARK
    _craft(dcp_run / "ep0-ba4.dcp", {"x": Payload(target)})
    with pytest.raises(CheckpointError, match=r"refusing to load the sharded checkpoint .*posix\.system|os\.system"):
        if entry == "load_path":
            _loads(fsdp, load_path=str(dcp_run / "ep0-ba4.dcp"))
        elif entry == "autoresume":
            shutil.rmtree(dcp_run / "ep0-ba2.dcp")   # the crafted one is the only checkpoint
            _loads(fsdp, save_folder=str(dcp_run), autoresume=True)
        else:
            export_whole(dcp_run / "ep0-ba4.dcp", tmp_path / "whole.pt")
    assert not target.exists()


def test_a_class_outside_the_allowed_set_is_refused_by_name(dcp_run, fsdp):
    _craft(dcp_run / "ep0-ba4.dcp", Outsider())
    with pytest.raises(CheckpointError, match="Outsider"):
        _loads(fsdp, load_path=str(dcp_run / "ep0-ba4.dcp"))


def _real_metadata(folder):
    return pickle.loads((folder / ".metadata").read_bytes())   # the test's own file: plain pickle is fine here


def test_a_non_tensor_entry_is_refused_since_dcp_would_unpickle_its_bytes(dcp_run, fsdp):
    """DCP loads a BytesStorageMetadata entry with torch.load(weights_only=False); hasten writes none."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    folder = dcp_run / "ep0-ba4.dcp"
    md = _real_metadata(folder)
    key = next(iter(md.state_dict_metadata))
    md.state_dict_metadata[key] = BytesStorageMetadata()
    _craft(folder, md)
    with pytest.raises(CheckpointError, match="BytesStorageMetadata"):
        _loads(fsdp, load_path=str(folder))


def test_a_shard_path_outside_the_folder_is_refused(dcp_run):
    folder = dcp_run / "ep0-ba4.dcp"
    md = _real_metadata(folder)
    info = next(iter(md.storage_data.values()))
    info.relative_path = "../../elsewhere.distcp"
    _craft(folder, md)
    with pytest.raises(CheckpointError, match="not a shard file inside the folder"):
        export_whole(folder, dcp_run.parent / "whole.pt")


def test_garbled_metadata_is_a_damaged_checkpoint_not_a_traceback(tmp_path):
    with pytest.raises(CheckpointError, match="damaged"):
        read_metadata_safely(b"\x80\x04garbage", tmp_path)
