"""Checkpoints: exact resume after SIGKILL and SIGTERM, atomic writes, safe loading."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hasten import Trainer
from hasten.callbacks import Checkpoint
from hasten.checkpoint import CheckpointError, CheckpointIO, find_latest, list_checkpoints

from tiny import loader, mlp

JOB = Path(__file__).parent / "helpers" / "resume_job.py"


def _job(folder, total, mode, stop_at, out, kind):
    return subprocess.run([sys.executable, str(JOB), str(folder), str(total), mode, str(stop_at), str(out), kind],
                          capture_output=True, text=True, timeout=300)


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("kind", ["hasten", "plain"])
def test_resume_after_sigkill_is_bit_exact(tmp_path, kind):
    """N steps straight == k steps, SIGKILL, resume to N; mid-epoch, with shuffling, dropout,
    random augmentation, DataLoader workers (hasten loader) and EMA in play."""
    straight = _job(tmp_path / "a", 30, "straight", -1, tmp_path / "a.pt", kind)
    assert straight.returncode == 0, straight.stderr
    killed = _job(tmp_path / "b", 30, "kill", 17, tmp_path / "unused.pt", kind)
    assert killed.returncode == -signal.SIGKILL
    assert [p.name for p in list_checkpoints(tmp_path / "b")][-1] == "ep1-ba15.pt"   # mid-epoch (12 a epoch)
    resumed = _job(tmp_path / "b", 30, "resume", -1, tmp_path / "b.pt", kind)
    assert resumed.returncode == 0, resumed.stderr
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert b["start"] == 15 and a["batch"] == b["batch"] == 30
    _same(a["model"], b["model"])
    for x, y in zip(a["ema"], b["ema"]):
        assert torch.equal(x, y)


def test_sigterm_saves_exits_cleanly_and_autoresumes(tmp_path):
    straight = _job(tmp_path / "a", 20, "straight", -1, tmp_path / "a.pt", "hasten")
    assert straight.returncode == 0, straight.stderr
    term = _job(tmp_path / "b", 20, "term", 9, tmp_path / "t.pt", "hasten")
    assert term.returncode == 0, term.stderr
    assert "SIGTERM received" in term.stdout
    t = torch.load(tmp_path / "t.pt")
    assert t["reason"] == "sigterm" and t["batch"] == 9
    assert (tmp_path / "b" / "ep0-ba9.pt").is_file()
    resumed = _job(tmp_path / "b", 20, "resume", -1, tmp_path / "b.pt", "hasten")
    assert resumed.returncode == 0, resumed.stderr
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert b["start"] == 9
    _same(a["model"], b["model"])


WRITER = r"""
import sys, torch
from hasten.checkpoint import CheckpointIO
io = CheckpointIO()
path = sys.argv[1]
io.save({"format": 1, "meta": "{}", "w": torch.ones(4)}, path)
print("first", flush=True)
io.save({"format": 1, "meta": "{}", "w": torch.zeros(64_000_000)}, path)   # 256 MB: killed while writing
print("second", flush=True)
"""


def test_kill_during_write_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "ck.pt"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "first"
    deadline = time.time() + 60
    while not list(tmp_path.glob(".ck.pt.*.tmp")) and time.time() < deadline:
        time.sleep(0.001)
    proc.kill()
    proc.wait()
    assert list(tmp_path.glob(".ck.pt.*.tmp")), "the writer was not caught mid-write"
    payload = CheckpointIO().load(path)
    assert torch.equal(payload["w"], torch.ones(4))


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


def test_loading_never_runs_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "ep0-ba1.pt"
    torch.save({"format": 1, "meta": "{}", "x": Evil()}, bad)
    with pytest.raises(CheckpointError, match="corrupt|refused"):
        CheckpointIO().load(bad)
    assert not (tmp_path / "pwned.txt").exists()


def test_corrupt_checkpoint_error_and_autoresume_skips_it(tmp_path):
    tr = Trainer(mlp(), loader(), max_duration="4ba", device="cpu", save_folder=str(tmp_path), save_interval="2ba")
    tr.fit()
    files = list_checkpoints(tmp_path)
    assert [p.name for p in files] == ["ep0-ba2.pt", "ep0-ba4.pt"] or [p.name for p in files] == ["ep0-ba4.pt"]
    latest = files[-1]
    latest.write_bytes(latest.read_bytes()[:100])   # truncated
    with pytest.raises(CheckpointError, match="corrupt, truncated"):
        CheckpointIO().load(latest)
    with pytest.warns(UserWarning, match="skipping unreadable"):
        found = find_latest(tmp_path)
    assert found is None or found != latest


def test_keep_last_and_best_k(tmp_path):
    cb = Checkpoint(tmp_path, interval="1ba", keep_last=1, keep_best=2, monitor="val/loss", mode="min")
    values = iter([5.0, 1.0, 4.0, 2.0, 3.0, 6.0])

    class FakeEval(Checkpoint.__mro__[1]):   # a Callback setting eval metrics before the checkpoint event
        def batch_end(self, state, logger):
            state.eval_metrics = {"val/loss": next(values)}

    tr = Trainer(mlp(), loader(n=48, batch_size=8), max_duration="6ba", device="cpu", callbacks=[FakeEval(), cb])
    tr.fit()
    kept = sorted(p.name for p in tmp_path.glob("*.pt"))
    # best two: batch 2 (1.0) and batch 4 (2.0); last one: batch 6
    assert kept == ["ep0-ba2.pt", "ep0-ba4.pt", "ep0-ba6.pt"]
    assert cb.best_path.endswith("ep0-ba2.pt")
    import json
    index = json.loads((tmp_path / "checkpoints.json").read_text())
    assert index["best"].endswith("ep0-ba2.pt")


def test_load_path_restores_model_and_optimizer(tmp_path):
    tr = Trainer(mlp(), loader(), max_duration="3ba", device="cpu", save_folder=str(tmp_path), save_interval="3ba",
                 optimizers=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))
    tr.fit()
    path = tr.state.last_checkpoint
    other = Trainer(mlp(), loader(), max_duration="3ba", device="cpu", load_path=path,
                    optimizers=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))
    for a, b in zip(tr.state.model.parameters(), other.state.model.parameters()):
        assert torch.equal(a, b)
    assert other.state.timestamp.batch == 3
    assert other.state.optimizer.state_dict()["state"][0]["step"] == 3
    with pytest.raises(CheckpointError, match="does not match"):
        Trainer(mlp(hidden=5), loader(), device="cpu", load_path=path)


def test_a_folder_of_checkpoints_stands_for_its_newest(tmp_path):
    """load_path= and load_checkpoint() take the save_folder itself (its newest checkpoint that
    loads), as they take a run folder; save_checkpoint() to a folder says to name a file."""
    first = Trainer(mlp(), loader(), max_duration="4ba", device="cpu", save_folder=str(tmp_path), save_interval="2ba")
    first.fit(summary=False)
    again = Trainer(mlp(), loader(), max_duration="6ba", device="cpu", load_path=str(tmp_path))
    assert again.state.timestamp.batch == 4
    other = Trainer(mlp(), loader(), max_duration="6ba", device="cpu")
    other.load_checkpoint(tmp_path)
    assert other.state.timestamp.batch == 4
    with pytest.raises(CheckpointError, match="is a folder; give a file in it"):
        first.save_checkpoint(tmp_path)

    class FolderIO(CheckpointIO):   # a user's I/O that writes a folder per checkpoint
        writes_folder = True

        def save(self, payload, path):
            (Path(path) / "payload.pt").parent.mkdir(parents=True, exist_ok=True)
            torch.save(payload, Path(path) / "payload.pt")

    own = Trainer(mlp(), loader(), max_duration="2ba", device="cpu", checkpoint_io=FolderIO())
    own.fit(summary=False)
    (tmp_path / "mine").mkdir()
    own.save_checkpoint(tmp_path / "mine")   # its own kind of target: not refused
    assert (tmp_path / "mine" / "payload.pt").is_file()
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="without a checkpoint to start from"):
        Trainer(mlp(), loader(), max_duration="2ba", device="cpu", load_path=str(empty))


def test_an_unreadable_checkpoint_is_described_without_torchs_advice_to_run_its_code(tmp_path):
    """torch's own message suggests weights_only=False, which would run code from the file:
    hasten's says what the file is instead."""
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a file torch.save wrote") as e:
        CheckpointIO().load(junk)
    assert "weights_only" not in str(e.value)
    obj = tmp_path / "obj.pt"
    torch.save({"x": Path("a")}, obj)   # a Python object weights_only refuses to rebuild
    with pytest.raises(CheckpointError, match=r"holds a Python object \(pathlib\.\w*Path\)") as e:
        CheckpointIO().load(obj)
    assert "weights_only" not in str(e.value)
