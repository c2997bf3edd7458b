"""The profile of a run: phases from the event order (checked on synthetic marks by hand), a
window whose step time matches an independent clock, a trace Perfetto reads, and the key
trainer.profile from a recipe."""
import json
import time

import pytest
import torch

from hasten import Callback, Trainer
from hasten.callbacks import Profile
from hasten.callbacks.profile import PHASES, phase_times
from hasten.core import Event as E

from helpers.tiny import loader, mlp, run_cli


def test_phases_from_event_marks_by_hand():
    marks = [(E.BEFORE_DATALOADER, "start", 0.0), (E.BEFORE_DATALOADER, "end", 0.1),
             (E.AFTER_DATALOADER, "start", 1.1), (E.AFTER_DATALOADER, "end", 1.2),        # data 1.0
             (E.BEFORE_FORWARD, "start", 1.2), (E.BEFORE_FORWARD, "end", 1.3),
             (E.AFTER_FORWARD, "start", 3.3), (E.AFTER_FORWARD, "end", 3.4),              # forward 2.0
             (E.BEFORE_LOSS, "start", 3.4), (E.BEFORE_LOSS, "end", 3.4),
             (E.AFTER_LOSS, "start", 3.9), (E.AFTER_LOSS, "end", 4.0),                    # loss 0.5
             (E.BEFORE_BACKWARD, "start", 4.2), (E.BEFORE_BACKWARD, "end", 4.2),          # reduction 0.2
             (E.AFTER_BACKWARD, "start", 7.2), (E.AFTER_BACKWARD, "end", 7.2),            # backward 3.0
             (E.BEFORE_OPTIM_STEP, "start", 7.2), (E.BEFORE_OPTIM_STEP, "end", 7.5),
             (E.AFTER_OPTIM_STEP, "start", 8.0), (E.AFTER_OPTIM_STEP, "end", 8.0),        # optimizer 0.5
             (E.BATCH_END, "start", 8.1), (E.BATCH_END, "end", 8.2),                      # + 0.1
             (E.EVAL_START, "start", 8.2), (E.EVAL_BATCH_START, "start", 8.3), (E.EVAL_BATCH_START, "end", 8.4),
             (E.EVAL_START, "end", 8.25), (E.EVAL_END, "start", 9.0), (E.EVAL_END, "end", 9.2),   # eval 1.0
             (E.CHECKPOINT, "start", 9.2), (E.CHECKPOINT, "end", 9.7)]                    # checkpoint 0.5
    t = phase_times(marks)
    assert t["data"] == pytest.approx(1.0) and t["forward"] == pytest.approx(2.7)
    assert t["backward"] == pytest.approx(3.0) and t["optimizer"] == pytest.approx(0.6)
    assert t["evaluation"] == pytest.approx(1.0) and t["checkpointing"] == pytest.approx(0.5)
    # dispatches outside evaluation and checkpoints: 0.1 (BDL) 0.1 (ADL) 0.1 (BF) 0.1 (AF) 0 0.1 (AL) 0 0 0.3 0 0.1
    assert t["hasten events"] == pytest.approx(0.9)


class Clock(Callback):
    def __init__(self):
        self.ends = []

    def batch_end(self, state, logger):
        self.ends.append(time.perf_counter())


def test_a_profiled_window_matches_an_independent_clock_and_writes_a_trace(tmp_path):
    torch.manual_seed(0)
    clock = Clock()
    prof = Profile(steps=12, warmup=3, folder=tmp_path / "p", print_table=False)

    class Slow(torch.nn.Module):   # a model whose step time is mostly its own (forward and backward)
        def __init__(self):
            super().__init__()
            self.net = mlp(8, 256, 4)

        def forward(self, x):
            for _ in range(20):
                x = x + 0.0 * self.net[0](x)[:, :8]
            return self.net(x)
    Trainer(Slow(), loader(n=256, batch_size=8), max_duration="20ba", callbacks=[prof, clock]).fit(summary=False)
    r = prof.result
    assert r["steps"] == 12 and set(r["shares"]) == set(PHASES)
    measured = (clock.ends[14] - clock.ends[2]) / 12          # batch ends 3..15: the window's steps
    assert r["step_s"] == pytest.approx(measured, rel=0.25)
    assert r["shares"]["forward"] + r["shares"]["backward"] > 0.5
    assert r["shares"]["other"] < 0.25 and abs(sum(r["shares"].values()) - 1) < 1e-6
    assert r["top_operators"] and all(op["calls"] > 0 for op in r["top_operators"])
    trace = json.loads((tmp_path / "p/trace.json").read_text())
    assert trace["traceEvents"]
    assert "| forward |" in (tmp_path / "p/profile.md").read_text()


def test_trainer_profile_from_a_recipe(tmp_path):
    cfg = tmp_path / "lm.yaml"
    cfg.write_text((__import__("pathlib").Path(__file__).parent / "helpers/tiny_lm.yaml").read_text())
    r = run_cli("train", str(cfg), f"trainer.run_dir={tmp_path / 'run'}", "trainer.max_duration=12ba",
                "trainer.profile=4", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "where the time went: 4 steps" in r.stderr
    assert (tmp_path / "run/profile/trace.json").exists()
