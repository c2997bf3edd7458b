"""hasten deletes only checkpoints it can prove are its own (issue: a checkpoint that deleted
other runs' files). Each case leaves every file outside the current checkpoint folder as it was."""
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hasten import Trainer
from hasten.callbacks import Checkpoint
from hasten.checkpoint import CheckpointIO
from hasten.errors import CheckpointError, RunFolderError
from hasten.files import FolderLock, file_mode

from tiny import loader, mlp


def _train(folder, batches, every=2, keep_last=1, **kw):
    cb = Checkpoint(str(folder), interval=f"{every}ba", keep_last=keep_last)
    tr = Trainer(mlp(), loader(n=64, batch_size=8), max_duration=f"{batches}ba", device="cpu", callbacks=[cb], **kw)
    tr.fit()
    return tr, cb


def _snapshot(root: Path) -> dict:
    """Every file under `root` with its bytes: what must stay untouched."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_loading_another_runs_checkpoint_never_deletes_its_files(tmp_path):
    _train(tmp_path / "A", 4)
    before = _snapshot(tmp_path / "A")
    assert "ep0-ba4.pt" in before
    _train(tmp_path / "B", 8, load_path=str(tmp_path / "A" / "ep0-ba4.pt"))   # B saves at 6 and 8, keep_last=1
    assert _snapshot(tmp_path / "A") == before
    assert sorted(p.name for p in (tmp_path / "B").glob("*.pt")) == ["ep0-ba8.pt"]


def _crafted(tmp_path, saved_paths):
    """A real checkpoint whose stored Checkpoint state names other files (plain strings pass weights_only)."""
    tr, _ = _train(tmp_path / "src", 2)
    payload = torch.load(tmp_path / "src" / "ep0-ba2.pt", weights_only=True)
    payload["callbacks"]["Checkpoint"] = {"saved": [{"path": p, "batch": i, "metric": None}
                                                    for i, p in enumerate(saved_paths)]}
    crafted = tmp_path / "crafted.pt"
    torch.save(payload, crafted)
    return crafted


def test_paths_stored_in_a_loaded_checkpoint_are_never_deleted(tmp_path, monkeypatch):
    victims = tmp_path / "victims"
    victims.mkdir()
    for name in ("ep0-ba1.pt", "notes.txt", "ep0-ba3.pt"):
        (victims / name).write_text(name)
    monkeypatch.chdir(victims)   # relative stored paths would resolve here
    crafted = _crafted(tmp_path, [str(victims / "ep0-ba1.pt"), str(victims / "notes.txt"), "ep0-ba3.pt"])
    before = _snapshot(victims)
    _train(tmp_path / "run", 8, load_path=str(crafted))
    assert _snapshot(victims) == before


def test_autoresume_of_a_crafted_checkpoint_in_the_folder_deletes_nothing_else(tmp_path):
    victims = tmp_path / "victims"
    victims.mkdir()
    (victims / "ep0-ba1.pt").write_text("precious")
    crafted = _crafted(tmp_path, [str(victims / "ep0-ba1.pt")])
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(crafted, run / "ep0-ba2.pt")
    # an index that lists the victim by a path and by a climbing name: neither is a name of this folder
    (run / "checkpoints.json").write_text(json.dumps({"format": 2, "checkpoints": [
        {"name": "../victims/ep0-ba1.pt", "run": "x", "batch": 1},
        {"name": str(victims / "ep0-ba1.pt"), "run": "x", "batch": 1}]}))
    _train(run, 8, autoresume=True)
    assert (victims / "ep0-ba1.pt").read_text() == "precious"


def test_a_resumed_copy_of_a_run_folder_leaves_the_original_alone(tmp_path):
    _train(tmp_path / "orig", 4, keep_last=2)
    before = _snapshot(tmp_path / "orig")
    shutil.copytree(tmp_path / "orig", tmp_path / "copy")
    _train(tmp_path / "copy", 12, keep_last=1, autoresume=True)
    assert _snapshot(tmp_path / "orig") == before
    assert sorted(p.name for p in (tmp_path / "copy").glob("*.pt")) == ["ep1-ba12.pt"]


def test_symlinks_are_never_followed_out_of_the_folder(tmp_path):
    outside = tmp_path / "outside.pt"
    outside.write_text("not hasten's")
    tr, cb = _train(tmp_path / "run", 2)
    run = tmp_path / "run"
    (run / "ep0-ba1.pt").symlink_to(outside)   # a link with a checkpoint's name, listed under this run's id
    index = json.loads((run / "checkpoints.json").read_text())
    index["checkpoints"].insert(0, {"name": "ep0-ba1.pt", "run": cb.run_id, "batch": 1, "metric": None})
    (run / "checkpoints.json").write_text(json.dumps(index))
    _train(run, 8, autoresume=True)
    assert outside.read_text() == "not hasten's"
    assert (run / "ep0-ba1.pt").is_symlink()


def test_a_fresh_run_refuses_a_folder_with_another_runs_checkpoints(tmp_path):
    _train(tmp_path / "run", 2)
    before = _snapshot(tmp_path / "run")
    with pytest.raises(RunFolderError, match="already holds checkpoints of another run"):
        _train(tmp_path / "run", 4)
    assert _snapshot(tmp_path / "run") == before


def test_keep_best_reads_its_metrics_from_the_folders_index_after_resume(tmp_path):
    values = iter([5.0, 1.0, 4.0, 2.0, 3.0, 6.0])

    class FakeEval(Checkpoint.__mro__[1]):
        def batch_end(self, state, logger):
            state.eval_metrics = {"val/loss": next(values)}

    def run(batches, autoresume):
        cb = Checkpoint(tmp_path, interval="1ba", keep_last=1, keep_best=2, monitor="val/loss")
        Trainer(mlp(), loader(n=48, batch_size=8), max_duration=f"{batches}ba", device="cpu",
                callbacks=[FakeEval(), cb], autoresume=autoresume).fit()
        return cb

    run(3, False)            # losses 5, 1, 4: keeps ba2 (best) and ba3 (last and second best)
    cb = run(6, True)        # losses 2, 3, 6: best two overall are ba2 (1.0) and ba4 (2.0)
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["ep0-ba2.pt", "ep0-ba4.pt", "ep0-ba6.pt"]
    assert cb.best_path.endswith("ep0-ba2.pt")


def test_a_second_writer_of_a_folder_is_refused(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from hasten.files import FolderLock; lock = FolderLock(sys.argv[1]).acquire(); "
        "print('locked', flush=True); time.sleep(60)"), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderError, match=f"in use by hasten process {holder.pid}"):
            _train(tmp_path, 2)
    finally:
        holder.kill()
        holder.wait()
    _train(tmp_path, 2)   # the lock died with its process (as after a SIGKILL)


def test_stale_temporaries_of_a_killed_save_are_removed_and_nothing_else(tmp_path):
    (tmp_path / ".ep0-ba6.pt.abc123.tmp").write_bytes(b"torn")
    (tmp_path / ".checkpoints.json.x1.tmp").write_text("{")
    (tmp_path / ".mine.tmp").write_text("user's")
    (tmp_path / "ep0-ba6.pt.bak").write_text("user's")
    _train(tmp_path, 2)
    left = {p.name for p in tmp_path.iterdir()}
    assert ".ep0-ba6.pt.abc123.tmp" not in left and ".checkpoints.json.x1.tmp" not in left
    assert {".mine.tmp", "ep0-ba6.pt.bak"} <= left


def test_checkpoints_and_index_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        _train(tmp_path, 2)
        expected = file_mode()
    finally:
        os.umask(old)
    assert expected == 0o640
    for name in ("ep0-ba2.pt", "checkpoints.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == expected, name


def test_disk_full_during_a_save_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    tr, cb = _train(tmp_path, 2)
    good = (tmp_path / "ep0-ba2.pt").read_bytes()

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    cb2 = Checkpoint(str(tmp_path), interval="2ba", keep_last=1)
    tr2 = Trainer(mlp(), loader(n=64, batch_size=8), max_duration="4ba", device="cpu", callbacks=[cb2],
                  autoresume=True)
    with pytest.raises(CheckpointError, match="no space left on the device while writing .*ep0-ba4.pt"):
        tr2.fit()
    assert (tmp_path / "ep0-ba2.pt").read_bytes() == good
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert CheckpointIO().load(tmp_path / "ep0-ba2.pt")["format"] == 1


def test_folder_lock_is_reentrant_per_object_and_released(tmp_path):
    a = FolderLock(tmp_path).acquire()
    with pytest.raises(RunFolderError, match="in use"):
        FolderLock(tmp_path).acquire()
    a.release()
    FolderLock(tmp_path).acquire().release()


def test_sharded_checkpoint_folders_follow_the_same_rules(tmp_path):
    from hasten.callbacks.checkpoint import remove_owned
    ours = tmp_path / "ep0-ba1.dcp"
    ours.mkdir()
    (ours / ".metadata").write_text("x")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "shard").write_text("not hasten's")
    (tmp_path / "ep0-ba2.dcp").symlink_to(outside, target_is_directory=True)
    assert remove_owned(tmp_path, "ep0-ba1.dcp") and not ours.exists()
    assert not remove_owned(tmp_path, "ep0-ba2.dcp")          # a link: neither it nor its target
    assert (outside / "shard").read_text() == "not hasten's"
    assert not remove_owned(tmp_path, "../x.dcp") and not remove_owned(tmp_path, "notes.dcp")
    torn = tmp_path / ".ep0-ba3.dcp.k2j1.tmp"               # a sharded save killed half-way
    torn.mkdir()
    (torn / "shard").write_text("torn")
    _train(tmp_path / "run", 2)   # another folder: untouched
    assert torn.exists()
    shutil.move(str(torn), tmp_path / "run" / torn.name)
    _train(tmp_path / "run", 4, autoresume=True)
    assert not (tmp_path / "run" / torn.name).exists()
