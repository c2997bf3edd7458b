"""Nothing lost, nothing silent, round two: one test per defect of the second probing round
(docs/reliability.md lists them with their fault-injection rows). Item 6 (the ignore-index
reduction) is in test_trainer.py, item 9 (exit 143 after SIGTERM) in test_resume.py, item 10
(a global batch smaller than the world) in test_distributed.py."""
import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Trainer
from hasten.algorithms import EMA
from hasten.bench.report import _ci
from hasten.bench.runner import Spec, run_comparison, run_identity
from hasten.bench.stats import ratio_ci
from hasten.bench.survival import censored_speedup, describe_speedup
from hasten.cli import main
from hasten.config import load_recipe
from hasten.errors import ConfigError, TrainingError
from hasten.loggers import JSONLLogger
from hasten.provenance import machine_identity

from tiny import classification_data, mlp

TINY = Path(__file__).parent / "helpers" / "tiny_lm.yaml"
QUICK = [str(TINY), "trainer.max_duration=10ba", "trainer.eval_interval=10ba", "data.eval_tokens=300",
         "trainer.tensorboard=false", "--no-progress"]


def _cli(*args, cwd=None, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", "hasten.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, **kw)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny trained run folder, for the compress items."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert main(["train", *QUICK, f"trainer.run_dir={run}"]) == 0
    return run


def _compress(run, *args):
    return main(["compress", str(run), "--prune", "0.5", "--no-latency", *args])


# ---------------------------------------------------------------------------- data lost or overwritten
def test_1_compress_never_overwrites_a_file_it_did_not_write_nor_writes_among_checkpoints(trained, tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    for name in ("notes.txt", "notes.md", "notes.json"):
        (tmp_path / name).write_text(f"mine: {name}")
    assert _compress(trained, "--out", str(notes)) == 2
    assert "ends in .hasten" in capsys.readouterr().err
    (tmp_path / "notes.md").write_text("my notes")
    assert _compress(trained, "--out", str(tmp_path / "notes.hasten")) == 2
    err = capsys.readouterr().err
    assert "notes.md exists and hasten compress did not write it" in err
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        "notes.txt": "mine: notes.txt", "notes.md": "my notes", "notes.json": "mine: notes.json"}
    ckpt = next((trained / "checkpoints").glob("ep*.pt"))
    before = ckpt.read_bytes()
    assert _compress(trained, "--out", str(ckpt)) == 2
    assert _compress(trained, "--out", str(trained / "checkpoints" / "small.hasten")) == 2
    assert "checkpoint folder" in capsys.readouterr().err
    assert ckpt.read_bytes() == before
    assert _compress(trained, "--out", str(tmp_path / "fresh.hasten")) == 0   # its own files may be replaced
    out = capsys.readouterr().out
    assert "will write:" in out and _compress(trained, "--out", str(tmp_path / "fresh.hasten")) == 0


def test_2_a_compression_with_other_settings_never_replaces_an_artifact(trained, capsys):
    assert _compress(trained, "--finetune", "4ba", "--finetune-lr", "3.0") == 0
    assert _compress(trained, "--finetune", "4ba", "--finetune-lr", "0.01") == 0
    names = sorted(p.name for p in (trained / "compressed").glob("*.hasten"))
    assert names == ["prune0.5-ft4ba-lr0.01.hasten", "prune0.5-ft4ba-lr3.hasten"], names
    capsys.readouterr()
    ckpts = sorted((trained / "checkpoints").glob("ep*.pt"))
    first = main(["compress", str(trained), "--prune", "0.3", "--no-latency"])
    again = main(["compress", str(trained), "--prune", "0.3", "--no-latency", "data.eval_tokens=200"])
    assert first == again == 0 and ckpts
    names = sorted(p.name for p in (trained / "compressed").glob("prune0.3*.hasten"))
    assert names == ["prune0.3-2.hasten", "prune0.3.hasten"]   # other overrides: a new name
    explicit = trained / "compressed" / "prune0.3.hasten"
    assert main(["compress", str(trained), "--prune", "0.3", "--no-latency", "data.eval_tokens=100",
                 "--out", str(explicit)]) == 2
    assert "other settings" in capsys.readouterr().err


def test_3_a_users_own_metrics_file_is_never_rewritten(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *QUICK, f"trainer.run_dir={run}"]) == 0
    ckpt = next((run / "checkpoints").glob("ep*.pt"))
    mine = tmp_path / "mine"
    mine.mkdir()
    text = "my own notes, not JSON\n" + json.dumps({"step": 99, "acc": 0.5}) + "\n"
    (mine / "metrics.jsonl").write_text(text)
    assert main(["train", *QUICK, f"trainer.run_dir={mine}", f"trainer.load_path={ckpt}"]) == 1
    assert "metrics.jsonl" in capsys.readouterr().err
    assert (mine / "metrics.jsonl").read_text() == text and sorted(os.listdir(mine)) == ["metrics.jsonl"]
    # the logger itself, resumed at step 5, drops only its own rows of later steps
    log = tmp_path / "m.jsonl"
    log.write_text("a line of mine\n" + "".join(json.dumps({"step": s, "x": 1.0}) + "\n" for s in (1, 5, 9))
                   + json.dumps({"note": "mine too"}) + "\n")
    j = JSONLLogger(log)
    j.resume_at(5)
    j.close()
    assert log.read_text().splitlines() == ["a line of mine", '{"step": 1, "x": 1.0}', '{"step": 5, "x": 1.0}',
                                            '{"note": "mine too"}']


# ---------------------------------------------------------------------------- silent wrong results
def _bench_record(spec, seed, identity):
    return {"label": spec.label, "recipe": spec.recipe, "overrides": spec.overrides, "seed": seed, "status": "finished",
            "wall_s": 1.0, "evals": [{"train_s": 1.0, "metrics": {"val/loss": 2.0}}],
            "final": {"metrics": {"val/loss": 2.0}, "train_s": 1.0}, "identity": identity}


def test_4_bench_never_reuses_runs_made_with_other_settings(tmp_path):
    old = Spec.parse(str(TINY), ["trainer.max_duration=10ba"])
    new = Spec.parse(str(TINY), ["trainer.max_duration=20ba", "optimizer.lr=0.05"])
    assert old.label == new.label
    (tmp_path / "runs.jsonl").write_text(json.dumps(_bench_record(old, 0, run_identity(old, None))) + "\n")
    with pytest.raises(ConfigError, match=r"other settings \(.*max_duration: '10ba' -> '20ba'"):
        run_comparison([new], [0], tmp_path)
    # the same settings are continued, not rerun
    assert len(run_comparison([old], [0], tmp_path)) == 1


def test_4_bench_never_continues_a_comparison_made_on_another_machine(tmp_path):
    spec = Spec.parse(str(TINY), ["trainer.max_duration=10ba"])
    here = machine_identity()
    elsewhere = {**here, "cpu": "Some Other CPU 9000", "flags": ["avx2"], "cores": 96}
    rows = [{**_bench_record(spec, seed, run_identity(spec, None)), "provenance": {"machine": mach}}
            for seed, mach in ((0, here), (1, elsewhere))]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=r"another machine \(Some Other CPU 9000 \(avx2\), 96 cores; this is .*--name"):
        run_comparison([spec], [0, 1], tmp_path)
    # seed 0 alone was made here: continued, not rerun
    assert [r["seed"] for r in run_comparison([spec], [0], tmp_path)] == [0]
    # kernels capped to AVX2 stand for another machine too, and the line says why
    capped = {**here, "kernel_caps": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
    row = {**_bench_record(spec, 2, run_identity(spec, None)), "provenance": {"machine": capped}}
    (tmp_path / "runs.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=r"another machine \(.*kernels capped by ONEDNN_MAX_CPU_ISA=AVX2"):
        run_comparison([spec], [2], tmp_path)


def test_5_a_forced_learning_rate_is_applied_on_resume(tmp_path):
    run = tmp_path / "run"
    args = [*QUICK, "schedule.name=constant", "schedule.warmup=0ba", "trainer.log_interval=5ba"]
    assert main(["train", *args, f"trainer.run_dir={run}"]) == 0
    assert main(["train", "--resume", str(run), "optimizer.lr=0.5", "optimizer.weight_decay=0.25",
                 "trainer.max_duration=20ba", "--force", "--no-progress"]) == 0
    lrs = {r["step"]: r["train/lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
           if "train/lr" in r}
    assert lrs[10] == pytest.approx(load_recipe(str(TINY)).optimizer.lr) and lrs[15] == lrs[20] == pytest.approx(0.5)
    payload = torch.load(next((run / "checkpoints").glob("ep0-ba20.pt")), weights_only=True)
    assert {g["weight_decay"] for g in payload["optimizers"][0]["param_groups"]} >= {0.25}


def test_7_a_target_on_a_metric_no_run_logs_is_refused_before_any_run(tmp_path, capsys):
    assert main(["bench", str(TINY), "--target", "val/los<=4", "--seeds", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "val/los" in err and "Did you mean 'val/loss'" in err and not any(tmp_path.iterdir())


def test_8_fewer_than_three_runs_a_side_give_no_interval():
    one = censored_speedup([(10.0, True)], [(5.0, True)])
    assert describe_speedup(one) == "2.000x (1 run a side: no interval, the runs are listed)"
    assert _ci({"ratio": 2.0, "low": float("nan"), "high": float("nan"), "n": (1, 1)}) == \
        "2.000x (1 run a side: no interval, the runs are listed)"
    two = censored_speedup([(10.0, True), (11.0, True)], [(5.0, True), (6.0, True)])
    assert math.isnan(two["low"]) and describe_speedup(two).endswith("(2 runs a side: no interval, the runs are listed)")
    assert math.isnan(ratio_ci([10.0, 11.0, 12.0], [5.0, 6.0])["low"])
    three = censored_speedup([(10.0, True), (11.0, True), (12.0, True)], [(5.0, True), (6.0, True), (6.5, True)])
    assert "[" in describe_speedup(three) and not math.isnan(ratio_ci([10.0, 11.0, 12.0], [5.0, 6.0, 6.5])["low"])


# ---------------------------------------------------------------------------- hangs
def test_11_a_loader_without_batches_is_an_error_naming_it(tmp_path):
    x, y = classification_data(5)
    empty = DataLoader(TensorDataset(x, y), batch_size=8, drop_last=True)
    tr = Trainer(mlp(), empty, max_duration="20ba", device="cpu", save_folder=str(tmp_path / "ck"))
    with pytest.raises(TrainingError, match=r"DataLoader over 5 samples, batch_size 8, drop_last True\) yields no batch in epoch 0"):
        tr.fit()
    assert not list((tmp_path / "ck").glob("ep*"))

    class NoLength:   # a loader without a length that yields nothing
        def __iter__(self):
            return iter(())
    with pytest.raises(TrainingError, match="yields no batch"):
        Trainer(mlp(), NoLength(), max_duration="20ba", device="cpu").fit()


def test_12_a_yaml_alias_bomb_is_refused_quickly(tmp_path, capsys):
    lines = ["base: shakespeare-char-baseline", 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append("description: *a8")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    assert main(["train", str(bomb), "--print-config"]) == 2
    assert "expands to more than" in capsys.readouterr().err and time.perf_counter() - t0 < 10
    from hasten.errors import brief
    assert len(brief(list(range(10**6)))) < 200


# ---------------------------------------------------------------------------- failures that say nothing
def test_13_a_closed_standard_output_does_not_stop_training(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "hasten.cli", "train", *QUICK, "trainer.max_duration=20ba", f"trainer.run_dir={run}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.readline()
    proc.stdout.close()   # as `| head -n 1` does
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, err
    assert "standard output was closed" in err and (run / "checkpoints" / "ep0-ba20.pt").is_file()


def test_14_a_run_that_never_trained_removes_what_it_made(tmp_path, capsys, monkeypatch):
    # a fault before the first step (here injected into fit): the new run folder goes, parents included
    run = tmp_path / "deep" / "run"

    def fails(self):
        raise TrainingError("a fault found before the first step")
    with monkeypatch.context() as m:
        m.setattr(Trainer, "fit", fails)
        assert main(["train", *QUICK, f"trainer.run_dir={run}"]) == 1
    assert "removed what it had made" in capsys.readouterr().err and not (tmp_path / "deep").exists()
    # SIGTERM while the run is set up (its data loading: a large corpus)
    corpus = tmp_path / "big.txt"
    corpus.write_text((Path(__file__).parent.parent / "src" / "hasten" / "data" / "tinyshakespeare.txt").read_text() * 20)
    run = tmp_path / "sig" / "run"
    proc = subprocess.Popen([sys.executable, "-m", "hasten.cli", "train", *QUICK, f"data.source={corpus}",
                             f"trainer.run_dir={run}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (run / ".hasten.lock").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in err, err
    assert not (tmp_path / "sig").exists()
    # Ctrl-C while Python imports hasten: one line, no traceback
    slow_import = ("import builtins, sys, time\n"
                   "real = builtins.__import__\n"
                   "def slow(name, *a, **k):\n"
                   "    if name == 'hasten.cli':\n"
                   "        print('importing', flush=True); time.sleep(30)\n"
                   "    return real(name, *a, **k)\n"
                   "builtins.__import__ = slow\n"
                   "import hasten_entry\n"
                   "sys.exit(hasten_entry.main())\n")
    # SIGINT at its default in the child (a shell's background job starts with it ignored, and Python
    # then never raises KeyboardInterrupt)
    proc = subprocess.Popen([sys.executable, "-c", slow_import, "recipes"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline().strip() == "importing"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "hasten: interrupted", err


@pytest.mark.parametrize("override, says", [
    ("trainer.eval_interval=0ba", "trainer.eval_interval: '0ba' is not an interval"),
    ("data.token_dtype=float7", "data.token_dtype: 'float7' is not allowed"),
    ("algorithms.ema=5", "algorithms.ema: 5 is not a section"),
    ("trainer.device=cuda", "trainer.device: device cuda is not available here"),
    ("optimizer.lr_multipliers={'*.bias': fast}", "optimizer.lr_multipliers.*.bias: expected a number"),
])
def test_15_values_are_checked_where_they_are_loaded(tmp_path, capsys, override, says):
    if override.startswith("trainer.device") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["train", *QUICK, override, f"trainer.run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_15_token_ids_beyond_the_vocabulary_and_a_zero_bench_cadence(tmp_path, capsys):
    import numpy as np
    np.arange(0, 300, dtype=np.uint16).tofile(tmp_path / "t.bin")
    assert main(["train", *QUICK, "data.tokenizer=none", f"data.train_file={tmp_path / 't.bin'}",
                 f"data.val_file={tmp_path / 't.bin'}", "model.vocab_size=256", f"trainer.run_dir={tmp_path / 'r'}"]) == 1
    assert "token id 299 is outside the vocabulary [0, 256)" in capsys.readouterr().err
    assert main(["bench", str(TINY), "--eval-every", "0ba", "--out", str(tmp_path / "b")]) == 2
    assert "--eval-every: '0ba' is not an interval" in capsys.readouterr().err


def test_16_one_message_for_a_newer_checkpoint_and_for_a_model_that_does_not_fit(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *QUICK, f"trainer.run_dir={run}"]) == 0
    ckpt = next((run / "checkpoints").glob("ep*.pt"))
    capsys.readouterr()
    assert main(["train", *QUICK, "model.n_embd=32", f"trainer.run_dir={tmp_path / 'b'}", f"trainer.load_path={ckpt}"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is [" in err and "model settings it was trained with" in err
    payload = torch.load(ckpt, weights_only=True)
    payload["format"] = 2
    torch.save(payload, ckpt)
    assert main(["train", "--resume", str(run), "trainer.max_duration=20ba", "--no-progress"]) == 1
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == [f"hasten: error: {ckpt} was written by a newer hasten (checkpoint format 2; "
                                        "this one reads format 1): upgrade hasten to resume or load it"]
    assert "starting the run from the beginning" not in out


def test_17_resuming_a_run_without_checkpoints_logs_each_step_once_and_compress_clears_its_temporaries(tmp_path):
    run = tmp_path / "run"
    assert main(["train", *QUICK, "trainer.max_duration=20ba", f"trainer.run_dir={run}"]) == 0
    for p in (run / "checkpoints").glob("ep*.pt"):
        p.unlink()
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["step"], k) for r in rows for k in r if k != "step"]
    assert len(keys) == len(set(keys)), "a step was written twice"
    left = run / "compressed" / ".prune0.5.hasten.x1y2.tmp"
    left.parent.mkdir()
    left.write_bytes(b"torn")
    assert _compress(run) == 0 and not left.exists()


# ---------------------------------------------------------------------------- a method that makes the model worse
def test_18_an_average_worse_than_the_trained_weights_is_not_put_in_place():
    """EMA with a long horizon over a short run: the average is worse than the trained weights.
    With an evaluation set the trained weights are kept, and said; without one the average goes
    in, and that is said."""
    x, y = classification_data(256)
    data = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)]

    def run(eval_set):
        torch.manual_seed(0)
        model = mlp()
        ema = EMA(decay=0.9, start="0ba")
        tr = Trainer(model, data, max_duration="16ba", device="cpu", algorithms=[ema], eval_interval="16ba",
                     eval_dataloader=data if eval_set else None,
                     optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.5))
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            tr.fit()
        return tr, ema, [str(w.message) for w in said]

    tr, ema, said = run(True)
    kept = torch.nn.functional.cross_entropy(tr.state.model(x), y).item()
    assert tr.logger.latest["ema/average_kept"] == 0.0
    assert tr.logger.latest["ema/average_val/loss"] > tr.logger.latest["ema/trained_val/loss"]
    assert any("the trained weights were kept" in m for m in said)
    assert tr.state.eval_metrics["val/loss"] == pytest.approx(kept, rel=1e-5)   # the final metrics: the model left
    tr2, ema2, said2 = run(False)
    for p, e in zip(tr2.state.model.parameters(), ema2.ema):
        assert torch.equal(p, e)
    assert any("put in place untested" in m for m in said2)
