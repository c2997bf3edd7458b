"""Continuing a run: the printed command continues the same run exactly, recipe.yaml is
never changed, Ctrl-C saves, metrics are written once per step, and a checkpoint of
another optimizer is refused."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from hasten import Trainer
from hasten.cli import main
from hasten.errors import CheckpointError
from hasten.loggers import JSONLLogger

from tiny import loader, mlp

TINY = Path(__file__).parent / "helpers" / "tiny_lm.yaml"
RUN = [str(TINY), "trainer.eval_interval=4ba", "data.eval_tokens=600", "--no-progress"]


def test_resume_keeps_the_stored_recipe_and_records_allowed_changes(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *RUN, "trainer.max_duration=8ba", f"trainer.run_dir={run}"]) == 0
    stored = (run / "recipe.yaml").read_bytes()
    from hasten.config import RECIPE_SCHEMA_VERSION
    assert yaml.safe_load(stored)["schema_version"] == RECIPE_SCHEMA_VERSION == 3
    assert main(["train", "--resume", str(run), "trainer.max_duration=12ba", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "resuming at batch 8" in out and "ep0-ba12.pt" in out
    assert (run / "recipe.yaml").read_bytes() == stored
    (rec,) = [json.loads(ln) for ln in (run / "resumes.jsonl").read_text().splitlines()]
    assert rec["changes"] == {"trainer.max_duration": ["8ba", "12ba"]} and not rec["forced"]
    vals = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "val/loss" in r]
    assert vals == [4, 8, 12]   # the run's own evaluation cadence, not the recipe file's default


def test_changes_to_the_runs_mathematics_are_refused_unless_forced(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *RUN, "trainer.max_duration=4ba", f"trainer.run_dir={run}"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "optimizer.lr=0.5", "trainer.max_duration=6ba"]) == 2
    err = capsys.readouterr().err
    assert "optimizer.lr" in err and "--force" in err and "max_duration" not in err.split("(")[1]
    # the old way to resume is checked the same way, and never rewrites recipe.yaml
    stored = (run / "recipe.yaml").read_bytes()
    assert main(["train", str(TINY), f"trainer.run_dir={run}", "trainer.autoresume=true"]) == 2
    assert "data.eval_tokens" in capsys.readouterr().err
    assert main(["train", str(TINY), f"trainer.run_dir={run}"]) == 1   # a second fresh run in the folder
    assert "already holds a run" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "optimizer.lr=0.5", "trainer.max_duration=6ba", "--force",
                 "--no-progress"]) == 0
    assert (run / "recipe.yaml").read_bytes() == stored
    rec = json.loads((run / "resumes.jsonl").read_text().splitlines()[-1])
    assert rec["forced"] and rec["changes"]["optimizer.lr"] == [0.001, 0.5]
    # the next resume continues with the forced change, so it is no change any more
    assert main(["train", "--resume", str(run), "trainer.max_duration=8ba", "--no-progress"]) == 0


def test_resume_of_a_folder_that_is_no_run(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path)]) == 1
    assert "not a hasten run folder" in capsys.readouterr().err


def _train_proc(*args):
    return subprocess.Popen([sys.executable, "-m", "hasten.cli", "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_batches(run: Path, proc, n=20):
    deadline = time.time() + 120
    while time.time() < deadline:
        m = run / "metrics.jsonl"
        if m.is_file() and any(json.loads(ln)["step"] >= n for ln in m.read_text().splitlines() if ln.strip()):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("the run did not start")


@pytest.mark.parametrize("sig, code, what", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_the_printed_command_continues_the_same_run_exactly(tmp_path, sig, code, what):
    args = [str(TINY), "trainer.max_duration=1200ba", "trainer.eval_interval=600ba", "trainer.log_interval=10ba",
            "data.eval_tokens=600", "--no-progress"]
    straight = subprocess.run([sys.executable, "-m", "hasten.cli", "train", *args,
                               f"trainer.run_dir={tmp_path / 'a'}"], capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr
    proc = _train_proc(*args, f"trainer.run_dir={tmp_path / 'b'}")
    _wait_for_batches(tmp_path / "b", proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert f"stopped by {what}" in out and "checkpoint: " in out
    assert "autoresume" not in out        # the CLI's own resume command, not the Trainer's hint for Python users
    if sig == signal.SIGINT:
        assert "saving a checkpoint" in err
    command = out.split("Resume with: ")[1].split()
    assert command[:3] == ["hasten", "train", "--resume"]
    stored = (tmp_path / "b" / "recipe.yaml").read_bytes()
    resumed = subprocess.run([sys.executable, "-m", "hasten.cli", *command[1:], "--no-progress"],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "b" / "recipe.yaml").read_bytes() == stored
    final = [ln for ln in straight.stdout.splitlines() if ln.startswith("final ")]
    assert final and final == [ln for ln in resumed.stdout.splitlines() if ln.startswith("final ")]
    rows = [json.loads(ln) for ln in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["step"], k) for r in rows for k in r if k != "step"]
    assert len(keys) == len(set(keys)), "a step was written twice"


def test_metrics_after_a_resume_hold_each_step_once(tmp_path):
    def run(batches, autoresume):
        tr = Trainer(mlp(), loader(n=64, batch_size=8), max_duration=f"{batches}ba", device="cpu", log_interval="1ba",
                     save_folder=str(tmp_path / "ck"), save_interval="4ba", autoresume=autoresume,
                     loggers=[JSONLLogger(tmp_path / "metrics.jsonl")])
        tr.fit()
        tr.close()

    run(6, False)   # checkpoints at 4 and 6; rows for steps 1..6
    (tmp_path / "ck" / "ep0-ba6.pt").unlink()   # as if killed after logging step 6, before its checkpoint
    run(8, True)    # resumes at 4: steps 5 and 6 are trained and logged again
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 8]


def test_a_checkpoint_of_another_optimizer_is_refused_naming_both(tmp_path):
    tr = Trainer(mlp(), loader(), max_duration="2ba", device="cpu", save_folder=str(tmp_path),
                 optimizers=lambda m: torch.optim.AdamW(m.parameters()))
    tr.fit()
    with pytest.raises(CheckpointError, match="optimizer 0 is AdamW, this run's is Adam"):
        Trainer(mlp(), loader(), device="cpu", load_path=tr.state.last_checkpoint,
                optimizers=lambda m: torch.optim.Adam(m.parameters()))


def test_ctrl_c_to_the_whole_group_saves_even_when_loader_workers_die_of_it(tmp_path):
    import os
    job = Path(__file__).parent / "helpers" / "ctrl_c_job.py"
    proc = subprocess.Popen([sys.executable, str(job), str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "started"
    time.sleep(3)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Ctrl-C received: checkpoint written" in out and "resume with autoresume=True" in out   # the Trainer's hint
    reason, batch = out.splitlines()[-1].split()[1:3]
    assert reason == "sigint" and (tmp_path / f"ep0-ba{batch}.pt").is_file()
