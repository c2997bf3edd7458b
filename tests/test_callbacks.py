"""EarlyStopping, SpeedMonitor, LRMonitor, ProgressBar and the loggers."""
import json

import pytest
import torch

from hasten import Trainer
from hasten.callbacks import EarlyStopping, LRMonitor, ProgressBar, SpeedMonitor
from hasten.core import State, Time
from hasten.errors import ConfigError
from hasten.loggers import JSONLLogger, TensorBoardLogger

from tiny import loader, mlp


def _feed(cb, values):
    state = State(model=mlp(), max_duration=Time.parse("1ep"), device=torch.device("cpu"))
    for i, v in enumerate(values):
        state.eval_metrics = {"val/loss": v}
        cb.eval_end(state, None)
        if state.stop_training:
            return i, state.stop_reason
    return None, None


def test_patience_counts_evaluations_with_min_delta():
    i, why = _feed(EarlyStopping(patience=2, min_delta=0.1), [1.0, 0.95, 0.91, 0.5, 0.45, 0.44])
    assert i == 2 and "did not improve for 2" in why          # 0.95 and 0.91 are within min_delta
    i, _ = _feed(EarlyStopping(patience=2, min_delta=0.1), [1.0, 0.8, 0.6, 0.4])
    assert i is None


def test_thresholds_and_mode_max():
    i, why = _feed(EarlyStopping(stopping_threshold=0.5), [1.0, 0.7, 0.5, 0.3])
    assert i == 2 and "stopping threshold" in why
    i, why = _feed(EarlyStopping(divergence_threshold=5.0, patience=10), [1.0, 2.0, 6.0])
    assert i == 2 and "divergence" in why
    i, why = _feed(EarlyStopping(patience=1), [1.0, float("nan")])
    assert i == 1 and "nan" in why
    cb = EarlyStopping(monitor="val/loss", mode="max", patience=1)
    assert _feed(cb, [0.5, 0.6, 0.55])[0] == 2


def test_early_stopping_stops_fit_and_state_resumes():
    cb = EarlyStopping(patience=1, min_delta=10.0)   # nothing improves by 10: stop at the second eval
    tr = Trainer(mlp(), loader(n=64, batch_size=8), max_duration="10ep", eval_dataloader=loader(n=16),
                 eval_interval="1ep", callbacks=[cb], device="cpu")
    tr.fit()
    assert tr.state.timestamp.epoch == 2 and tr.state.stop_reason.startswith("early stopping")
    fresh = EarlyStopping()
    fresh.load_state_dict(cb.state_dict())
    assert fresh.best == cb.best and fresh.bad_evals == 1
    with pytest.raises(ConfigError, match="val/acc"):
        _feed(EarlyStopping(monitor="val/acc"), [1.0])


def test_monitors_and_loggers_write_what_they_measure(tmp_path):
    class Flops(torch.nn.Sequential):
        pass
    jsonl = tmp_path / "m.jsonl"
    tr = Trainer(mlp(), loader(n=64, batch_size=8), max_duration="8ba", device="cpu", log_interval="4ba",
                 callbacks=[ProgressBar(), SpeedMonitor(flops_per_sample=100.0, peak_flops=1e9), LRMonitor()],
                 loggers=[JSONLLogger(jsonl), TensorBoardLogger(tmp_path / "tb")],
                 eval_dataloader=loader(n=16), eval_interval="8ba")
    tr.fit()
    tr.close()
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train_rows] == [4, 8]
    r = train_rows[0]
    assert r["throughput/samples_per_sec"] > 0
    assert r["throughput/flops_per_sec"] == pytest.approx(100.0 * r["throughput/samples_per_sec"])
    assert r["throughput/mfu"] == pytest.approx(r["throughput/flops_per_sec"] / 1e9)
    assert r["lr/opt0/group0"] == 1e-3
    assert any("val/loss" in r for r in rows)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_progress_bar_off_a_terminal_prints_whole_lines_at_each_tenth():
    """Into a log file a redrawn bar would be one line cut to 80 columns at the end; there the
    bar prints a plain line at each tenth of the run and a last one after the final evaluation."""
    import io
    from rich.console import Console
    out = io.StringIO()
    bar = ProgressBar(refresh_hz=1e9, console=Console(file=out, width=40))
    assert bar.plain                                    # a StringIO is no terminal
    tr = Trainer(mlp(), loader(n=160, batch_size=8), max_duration="20ba", device="cpu", log_interval="1ba",
                 callbacks=[bar], eval_dataloader=loader(n=16), eval_interval="20ba")
    tr.fit()
    tr.close()
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == [f"{2 * i}/20" for i in range(1, 11)]
    assert [line.split()[3] for line in lines] == [f"({10 * i}%)" for i in range(1, 11)]
    assert all(len(line) > 40 for line in lines)        # never cut to the console's width
    assert "val/loss=" in lines[-1] and "eta" not in lines[-1] and "val/loss=" not in lines[0]
    assert all("eta" in line for line in lines[:-1])
    with pytest.raises(ValueError, match="plain_every"):
        ProgressBar(plain_every=0)


def test_bench_and_tune_progress_off_a_terminal_prints_a_line_per_part():
    import io
    from rich.console import Console
    from rich.progress import Progress, TextColumn
    from hasten.callbacks.progress import LineProgress, work_progress
    assert isinstance(work_progress("bench", Console(file=io.StringIO(), force_terminal=True), TextColumn("x")),
                      Progress)
    out = io.StringIO()
    with work_progress("bench", Console(file=out, width=30)) as progress:
        assert isinstance(progress, LineProgress)
        task = progress.add_task("", total=4)
        for i in range(4):
            progress.update(task, description=f"a-long-recipe-name+some.override=1 seed {i}")
            progress.advance(task)
        progress.update(task, description=f"a-long-recipe-name+some.override=1 seed {i}")   # no change: no line
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["[0/4]", "[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    assert "seed 3" in lines[3] and "eta" in lines[3] and "eta" not in lines[0]
    assert lines[-1].startswith("bench [4/4] done (") and "eta" not in lines[-1]
