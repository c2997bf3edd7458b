"""hasten writes only files it can prove it made (hasten.outputs), in every command that writes
output; a second command into the same folder is refused; children end with their command."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import hasten.tune.search as search_mod
from hasten.bench import runner
from hasten.errors import ConfigError, RunFolderError
from hasten.outputs import INDEX, Outputs
from hasten.tune import Tuner, write
from hasten.tune.lr_range import lr_range_test
from hasten.tune.plan import read_cache

TINY = Path(__file__).parent / "helpers" / "tiny_lm.yaml"


def test_a_file_is_replaced_only_while_it_holds_what_hasten_wrote(tmp_path):
    out = Outputs(tmp_path, "hasten test")
    out.write("a.txt", lambda f: f.write("one"))
    out.check(["a.txt", "b.txt"], "choose another folder")          # its own, and one not there
    (tmp_path / "a.txt").write_text("the user's edit")
    with pytest.raises(ConfigError, match=r"a\.txt exists and hasten test did not write it .*choose another folder"):
        out.check(["a.txt"], "choose another folder")
    (tmp_path / "c.txt").write_text("the user's own")
    with pytest.raises(ConfigError, match=r"c\.txt exists"):
        out.check(["c.txt"], "x")
    out.claim(["c.txt"])   # a command stopped between its claim and its record: the claim stands
    out.check(["c.txt"], "x")
    os.symlink(tmp_path / "a.txt", tmp_path / "link.txt")
    with pytest.raises(ConfigError, match="link.txt"):
        out.check(["link.txt"], "x")
    (tmp_path / INDEX).write_text("{not json")   # an index that cannot be read proves nothing
    with pytest.raises(ConfigError, match="c.txt"):
        out.check(["c.txt"], "x")


def test_a_second_command_into_a_held_folder_is_refused(tmp_path):
    first = Outputs(tmp_path, "hasten tune").lock("tune output folder")
    try:
        with pytest.raises(RunFolderError, match="in use"):
            Outputs(tmp_path, "hasten tune").lock("tune output folder")
    finally:
        first.unlock()
    Outputs(tmp_path, "hasten tune").lock("tune output folder").unlock()


def _result(**kw):
    from hasten.tune.plan import machine_key
    return {"recipe": "tiny", "recipe_arg": str(TINY), "overrides": [], "machine": machine_key(), "table": [],
            "decisions": {}, "skipped": [], "guard": {"checked": False, "why": "none"}, "tuned_overrides": [],
            "min_gain": 0.05, "searched_overrides": [], "speedup": 1.0, "tuned": None, "as_written": None,
            "budget_s": 60, "spent_s": 6, "date": "today", **kw}


def test_tune_never_replaces_a_users_files_and_checks_before_any_trial(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "tuned.yaml").write_text("my own recipe\n")
    monkeypatch.setattr(Tuner, "search", lambda self: pytest.fail("a trial ran before the folder was checked"))
    with pytest.raises(ConfigError, match=r"tuned\.yaml exists and hasten tune did not write it"):
        search_mod.tune(str(TINY), [], budget_s=60, out=out)
    assert (out / "tuned.yaml").read_text() == "my own recipe\n"
    with pytest.raises(ConfigError, match="tuned.yaml"):
        write(_result(), out)
    # its own files it replaces, and a folder written before the index is adopted from its tune.json
    mine = tmp_path / "mine"
    write(_result(), mine)
    write(_result(date="tomorrow"), mine)
    assert json.loads((mine / "tune.json").read_text())["date"] == "tomorrow"
    os.remove(mine / INDEX)
    write(_result(date="later"), mine)
    assert json.loads((mine / "tune.json").read_text())["date"] == "later"


def test_two_tunes_into_one_folder_the_second_is_refused(tmp_path, monkeypatch):
    held = Outputs(tmp_path / "out", "hasten tune").lock("tune output folder")
    monkeypatch.setattr(Tuner, "search", lambda self: pytest.fail("the second tune searched"))
    try:
        with pytest.raises(RunFolderError, match="in use"):
            search_mod.tune(str(TINY), [], budget_s=60, out=tmp_path / "out")
    finally:
        held.unlock()


def test_a_recipe_that_cannot_train_is_an_error_and_nothing_is_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(Tuner, "run_trial", lambda self, overrides, label, **kw: {
        "label": label, "status": "failed", "reason": "ValueError: the model does not fit the data", "warmup": 0})
    with pytest.raises(ConfigError, match="does not train on this machine .*the model does not fit the data"):
        search_mod.tune(str(TINY), [], budget_s=60, out=tmp_path / "out")
    assert not (tmp_path / "out" / "tuned.yaml").exists()
    assert not list((Path(os.environ["HASTEN_DATA"]) / "tune").glob("*.json"))


def test_a_damaged_tune_cache_is_measured_again_with_one_warning(tmp_path):
    bad = tmp_path / "c.json"
    bad.write_text('{"date": "x", "recipe": ')
    with pytest.warns(UserWarning, match="unreadable .*measuring again"):
        assert read_cache(bad) is None
    bad.write_text(json.dumps({"date": "x", "recipe": "r", "machine": {}, "table": "nope", "overrides": [],
                               "tuned_overrides": []}))
    with pytest.warns(UserWarning, match="table missing or of the wrong type"):
        assert read_cache(bad) is None
    good = _result()
    bad.write_text(json.dumps(good))
    assert read_cache(bad) == good
    assert read_cache(tmp_path / "none.json") is None


def test_the_lr_range_test_never_replaces_a_users_files(tmp_path):
    (tmp_path / "lr.md").write_text("notes\n")
    with pytest.raises(ConfigError, match=r"lr\.md exists and hasten tune --lr did not write it"):
        lr_range_test(str(TINY), [], steps=20, out=tmp_path)
    assert (tmp_path / "lr.md").read_text() == "notes\n"


def test_bench_refuses_a_users_files_and_continues_its_own_folders(tmp_path, monkeypatch):
    specs = [runner.Spec.parse(str(TINY))]
    user = tmp_path / "user"
    user.mkdir()
    (user / "report.md").write_text("my report\n")
    with pytest.raises(ConfigError, match=r"report\.md exists and hasten bench did not write it"):
        runner.check_earlier_runs(specs, [0], user, None, None)
    # a comparison folder from before the index: its runs.jsonl of bench records proves it bench's
    old = tmp_path / "old"
    (old / "logs").mkdir(parents=True)
    record = {"label": specs[0].label, "seed": 5, "status": "failed", "final": None, "evals": []}
    (old / "runs.jsonl").write_text(json.dumps(record) + "\n")
    (old / "report.md").write_text("# an old bench report\n")
    log = old / runner.log_names(specs[0], 0)[1]
    log.write_text("an old log of this run\n")
    runner.check_earlier_runs(specs, [0], old, None, None)

    def fake(spec, seed, out_dir, cap_s=None, keep=None):
        runner.bench_outputs(out_dir).claim(runner.log_names(spec, seed))
        return {"label": spec.label, "seed": seed, "status": "finished", "evals": [], "final": {}, "log": "x"}

    monkeypatch.setattr(runner, "run_one", fake)
    runner.run_comparison(specs, [0], old)
    assert len((old / "runs.jsonl").read_text().splitlines()) == 2
    (old / "report.md").write_text("edited by hand\n")   # now indexed: an edit makes it the user's
    with pytest.raises(ConfigError, match="report.md"):
        runner.check_earlier_runs(specs, [0], old, None, None)


def test_a_worker_ends_with_its_command_even_when_that_is_killed(tmp_path):
    """The command is SIGKILLed (no handler can run): the kernel still stops its worker."""
    pidfile = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from hasten.processes import spawn
        child = spawn([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pidfile)!r}, "w").write(str(child.pid))
        time.sleep(60)
    """)])
    deadline = time.time() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    child = int(pidfile.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        try:   # a zombie reaped by init still answers kill(0) briefly; its state says it is gone
            if Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":
                break
        except OSError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the worker outlived its command")
