"""hasten bench counts only runs that finished, keeps interrupted ones out, cleans up after
a signal, and checks its own input before it runs anything."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hasten.bench import report as R
from hasten.bench import runner
from hasten.cli import main

TINY = Path(__file__).parent / "helpers" / "tiny_lm.yaml"


def _record(label, seed, status, stop_reason=None):
    fin = {"kind": "final", "metrics": {"val/loss": 3.0}, "train_s": 1.0, "warmup_s": 0.0, "eval_s": 0.1,
           "data_setup_s": 0.1, "sample": 10, "token": 10, "batch": 4, "peak_memory_bytes": 1,
           "stop_reason": stop_reason, "machine": {"cpu": "x"}}
    return {"label": label, "seed": seed, "status": status, "evals": [], "final": fin}


def test_outcomes_of_old_and_new_records():
    assert runner.outcome(_record("a", 0, "ok")) == "finished"
    assert runner.outcome(_record("a", 0, "ok", "sigterm")) == "interrupted"   # old records said ok
    assert runner.outcome(_record("a", 0, "capped")) == "capped"


def test_interrupted_and_failed_runs_are_not_counted_and_are_rerun(tmp_path, monkeypatch):
    out = tmp_path / "cmp"
    out.mkdir()
    old = [_record("a", 0, "ok", "sigterm"), _record("a", 1, "interrupted"), _record("a", 2, "failed"),
           _record("a", 3, "finished"), _record("a", 4, "capped")]
    (out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    calls = []

    def fake(spec, seed, out_dir, cap_s=None, nproc=1):
        calls.append(seed)
        return _record(spec.label, seed, "finished")

    monkeypatch.setattr(runner, "run_one", fake)
    runs = runner.run_comparison([runner.Spec.parse("a")], [0, 1, 2, 3, 4], out)
    assert calls == [0, 1, 2]
    res = R.analyse(runs, ["a"], R.Target.parse("val/loss<=5"))
    assert res["recipes"]["a"]["runs"] == 5 and res["failed"] == [] and res["interrupted"] == []


def test_a_worker_stopped_by_sigterm_is_recorded_interrupted(tmp_path):
    spec = runner.Spec.parse(f"{TINY}+trainer.max_duration=100000ba")
    pids = []

    def term_the_worker():
        deadline = time.time() + 60
        while time.time() < deadline:
            found = subprocess.run(["pgrep", "-f", f"hasten.bench.worker .*{tmp_path}"], capture_output=True, text=True)
            logs = list((tmp_path / "logs").glob("*.jsonl")) if (tmp_path / "logs").is_dir() else []
            if found.stdout.strip() and logs and logs[0].read_text():   # training has started
                pid = int(found.stdout.split()[0])
                pids.append(pid)
                os.kill(pid, signal.SIGTERM)
                return
            time.sleep(0.2)

    t = threading.Thread(target=term_the_worker)
    t.start()
    record = runner.run_one(spec, 0, tmp_path)
    t.join()
    assert pids, "the worker was not found"
    assert record["status"] == "interrupted" and record["final"]["stop_reason"] == "sigterm"


def test_ctrl_c_to_bench_stops_its_worker_cleans_up_and_says_how_to_continue(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "hasten.cli", "bench", str(TINY), "trainer.max_duration=100000ba",
                             "--target", "val/loss<=1", "--seeds", "2", "--out", str(tmp_path / "out"), "--name", "c"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    logs = tmp_path / "out" / "c" / "logs"
    deadline = time.time() + 60
    while time.time() < deadline and not (list(logs.glob("*.jsonl")) if logs.is_dir() else []):
        time.sleep(0.2)
    worker = subprocess.run(["pgrep", "-f", f"hasten.bench.worker .*{tmp_path}"], capture_output=True, text=True)
    assert worker.stdout.strip(), "no worker started"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Continue with the same command" in err
    left = subprocess.run(["pgrep", "-f", f"hasten.bench.worker .*{tmp_path}"], capture_output=True, text=True)
    assert not left.stdout.strip(), "the worker was left running"
    assert not list((tmp_path / "tmp").glob("hasten-bench-*")), "the worker's temporary folder was left"
    runs = [json.loads(ln) for ln in (tmp_path / "out" / "c" / "runs.jsonl").read_text().splitlines()]
    assert [r["status"] for r in runs] == ["interrupted"]


@pytest.mark.parametrize("args, message", [
    (["--target", "val/loss<<1"], "cannot read target"),
    (["--target", "val/loss<=1", "--seeds", "0"], "--seeds 0"),
    (["--target", "val/loss<=1", "--seeds", "-1"], "--seeds -1"),
    (["--target", "val/loss<=1", "--eval-every", "10 batches"], "--eval-every"),
    (["--target", "val/loss<=1", "--cap", "0"], "--cap"),
])
def test_bench_checks_its_arguments_before_running(tmp_path, capsys, args, message):
    code = main(["bench", str(TINY), "--out", str(tmp_path)] + args)
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())   # nothing ran


def test_a_misspelled_recipe_is_an_error_before_any_run(tmp_path, capsys):
    code = main(["bench", "shakespeare-char-basline", "--target", "val/loss<=1", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "Did you mean 'shakespeare-char-baseline'" in err
    assert not any(tmp_path.iterdir())


def test_failed_runs_are_listed_with_their_error_and_the_exit_is_non_zero(tmp_path, capsys):
    code = main(["bench", str(TINY), f"{TINY}+data.source={tmp_path / 'missing.txt'}", "--target", "val/loss<=9",
                 "--seeds", "1", "--out", str(tmp_path), "--name", "f"])
    assert code == 1
    text = (tmp_path / "f" / "report.json").read_text()
    res = json.loads(text, parse_constant=lambda c: pytest.fail(f"report.json holds {c}"))
    assert [f["seed"] for f in res["failed"]] == [0]
    assert "missing.txt" in res["failed"][0]["error"]
    assert "## Failed runs" in (tmp_path / "f" / "report.md").read_text()


def test_keep_checkpoints_leaves_each_runs_final_checkpoint_where_load_path_reads_it(tmp_path, capsys):
    keep = tmp_path / "kept"
    code = main(["bench", str(TINY), "--target", "val/loss<=99", "--seeds", "1", "--out", str(tmp_path),
                 "--name", "k", "--keep-checkpoints", str(keep)])
    assert code == 0
    run = json.loads((tmp_path / "k" / "runs.jsonl").read_text().splitlines()[0])
    folder = keep / "tiny_lm-seed0"
    assert run["run_dir"] == str(folder)
    # the final checkpoint alone (not one per evaluation), at the run's last batch
    assert sorted(p.name for p in (folder / "checkpoints").glob("*.pt")) == [f"ep0-ba{run['final']['batch']}.pt"]
    # the worker runs as a script that the package itself never imported (else Python warns in every run's log)
    assert "RuntimeWarning" not in (tmp_path / "k" / "logs" / "tiny_lm-seed0.log").read_text()
    # the kept run is a starting point for another run, as a run folder of hasten train is
    code = main(["train", str(TINY), "trainer.max_duration=1ba", f"trainer.load_path={folder}", "trainer.load_mode=weights",
                 f"trainer.run_dir={tmp_path / 'next'}", "--no-progress", "trainer.tensorboard=false"])
    assert code == 0
    # without the option a bench writes no checkpoint at all
    assert main(["bench", str(TINY), "--target", "val/loss<=99", "--seeds", "1", "--out", str(tmp_path),
                 "--name", "n"]) == 0
    assert not list((tmp_path / "n").rglob("*.pt"))


def test_an_unusable_keep_checkpoints_folder_is_refused_before_the_bench_starts(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code = main(["bench", str(TINY), "--target", "val/loss<=99", "--seeds", "1", "--out", str(tmp_path),
                 "--name", "k", "--keep-checkpoints", str(blocker / "kept")])
    err = capsys.readouterr().err
    assert code != 0 and "--keep-checkpoints" in err
    assert "results in" not in err                      # refused before the bench says it starts
    assert not (tmp_path / "k" / "runs.jsonl").exists()  # and before any run
