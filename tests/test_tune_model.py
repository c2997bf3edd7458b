"""`hasten tune` on the user's own model: stages decided from the model and loaders built, a
summary that follows the measurements (a separated 1.9x, a noisy interval, a busy machine), the
method stage's selection rule; and the user's path made explicit (a factory's data settings,
augmentation that resumes exactly, an average judged on a host's validation, micro-batching
under batch norm, the profile's advice)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import hasten.tune.methods as methods_mod
from hasten.config import load_recipe
from hasten.errors import BusyMachineError, ConfigError
from hasten.tune import Option, Trial, Tuner, stages, summary
from hasten.tune.plan import throughput

from tiny import image_zip

USER_NET = textwrap.dedent("""
    import torch
    from torch import nn

    class MyResNet(nn.Module):
        def __init__(self, num_classes=10):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
            self.head = nn.Linear(8, num_classes)

        def forward(self, x):
            return self.head(self.body(x))

    class MyMLP(nn.Module):
        def __init__(self, num_classes=10):
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, num_classes))

        def forward(self, x):
            return self.net(x)
""")


@pytest.fixture
def user_model(tmp_path, monkeypatch):
    (tmp_path / "byom.py").write_text(USER_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("task", ["image_classification", "classification"])
@pytest.mark.parametrize("model, conv", [("byom:MyResNet", True), ("byom:MyMLP", False)])
def test_the_stages_follow_the_model_built_through_every_task_alias(user_model, task, model, conv):
    from hasten.tune.worker import main
    zpath = image_zip(user_model / "c.zip", train=16, test=8)
    (user_model / "r.yaml").write_text(f"task: {task}\nmodel: {{name: '{model}'}}\n"
                                       f"data: {{path: {zpath}, batch_size: 8, num_workers: 0}}\n"
                                       "trainer: {max_duration: 4ba, tensorboard: false}\n")
    spec = {"label": "as written", "recipe": str(user_model / "r.yaml"), "overrides": [], "run_dir": str(user_model / "run"),
            "warmup": 1, "steps": 2, "min_seconds": 0.0, "max_steps": 3}
    (user_model / "spec.json").write_text(json.dumps(spec))
    main(str(user_model / "spec.json"), str(user_model / "out.json"))
    out = json.loads((user_model / "out.json").read_text())
    assert out["status"] == "ok", out
    facts = out["facts"]
    assert facts["conv2d"] is conv and facts["model"] in ("MyResNet", "MyMLP")
    plan = {name: (options, why) for name, options, why in stages(load_recipe(str(user_model / "r.yaml")), facts)}
    options, why = plan["channels_last"]
    if conv:
        assert options and not why
    else:
        assert not options and why == "the model built (MyMLP) has no 2-D convolutions"


SLOW_DATA = textwrap.dedent("""
    import time
    import torch

    class Slow(torch.utils.data.Dataset):   # a user's Dataset whose per-sample work is CPU-bound
        def __len__(self):
            return 256

        def __getitem__(self, i):
            t = time.process_time()
            while time.process_time() - t < 0.004:
                pass
            return torch.zeros(3, 8, 8), i % 10

    def make():
        return Slow(), Slow()
""")


@pytest.mark.parametrize("workers", [0, 1])
def test_a_trial_measures_the_cores_its_loader_workers_keep_busy(user_model, workers):
    (user_model / "slowdata.py").write_text(SLOW_DATA)
    (user_model / "r.yaml").write_text("task: classification\nmodel: {name: 'byom:MyResNet'}\n"
                                       f"data: {{factory: 'slowdata:make', num_classes: 10, batch_size: 8, num_workers: {workers}}}\n"
                                       "trainer: {max_duration: 4ba, tensorboard: false}\n")
    spec = {"label": "as written", "recipe": str(user_model / "r.yaml"), "overrides": [],
            "run_dir": str(user_model / "run"), "warmup": 2, "steps": 12, "min_seconds": 0.0, "max_steps": 14}
    (user_model / "spec.json").write_text(json.dumps(spec))
    # in its own process, as the tune runs it: the trial's descendants are then only its loader's workers
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(user_model), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "hasten.tune.worker", str(user_model / "spec.json"),
                    str(user_model / "out.json")], cwd=user_model, env=env, check=True, timeout=300)
    out = json.loads((user_model / "out.json").read_text())
    assert out["status"] == "ok", out
    if workers:   # the worker spins 32 ms a batch for a step of a few ms: it is busy most of the window
        assert out["loader_cores"] > 0.25, out["loader_cores"]
    else:
        assert out["loader_cores"] == 0.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the trial reads /proc")
def test_a_worker_that_ends_inside_the_window_still_counts_as_the_trials_own():
    # a DataLoader without persistent workers ends and reaps them at each epoch's end; their
    # ticks must stay the trial's, not turn into "another process on the cores"
    import resource
    from hasten.tune.worker import _cpu_ticks
    hz = os.sysconf("SC_CLK_TCK")
    before, usage = _cpu_ticks(), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                    "while time.process_time() - t < 0.4: pass"], check=True, timeout=60)
    after, usage_after = _cpu_ticks(), resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (usage_after.ru_utime + usage_after.ru_stime) - (usage.ru_utime + usage.ru_stime)   # the kernel's own count
    assert reaped >= 0.4
    workers, tree = ((after[i] - before[i]) / hz for i in (2, 1))
    assert abs(workers - reaped) < 0.05 + 0.1 * reaped, (workers, reaped)
    assert tree >= workers   # the tree's own ticks hold it too, beside this process's


def test_the_report_points_to_loader_workers_that_take_the_steps_cores():
    from hasten.tune.report import loader_lines
    row = {"stage": "threads", "option": "2 threads", "chosen": True, "loader_cores": 0.9}
    lines = loader_lines({"machine": {"cores": 2}, "table": [row]})
    assert "kept 0.90 of the 2 cores busy" in "".join(lines)
    assert loader_lines({"machine": {"cores": 2}, "table": [{**row, "loader_cores": 0.1}]}) == []
    assert loader_lines({"machine": {"cores": 2}, "table": [{**row, "chosen": False}]}) == []


def test_a_factory_skips_the_loader_stage_saying_why():
    recipe = load_recipe("cifar10-baseline", ["data.factory=pkg:make"])
    plan = {name: (options, why) for name, options, why in stages(recipe, {"conv2d": True, "loader": "DataLoader"})}
    assert plan["loader"] == ([], "data.factory: your loaders (DataLoader) are used as given")


def _trial(label, times_by_round, first=None):
    t = Trial(Option("final", label, []))
    for r, times in enumerate(times_by_round):
        t.results.append({"status": "ok", "warmup": 0 if first is None else 1, "round": r,
                          "times": ([first] if first is not None else []) + list(times)})
    return t


def _tuner(run_len="100ba"):
    tuner = Tuner.__new__(Tuner)
    tuner.recipe, tuner.min_gain = load_recipe("cifar10-narrow", [f"trainer.max_duration={run_len}"]), 0.05
    return tuner


def test_a_separated_19x_is_handed_over_and_a_rejection_says_which_rule_with_its_numbers():
    tuned = _trial("tuned", [[0.52, 0.51, 0.53] * 3, [0.52, 0.52, 0.51] * 3])
    written = _trial("as written", [[1.0, 0.99, 1.01] * 3, [1.0, 1.01, 0.99] * 3])
    tuner = _tuner()
    hand = tuner._hand_over(tuned, written, written, 100.0)
    assert hand == {"passed": True, "why": {}}
    # the same step times, but compiling costs 100 s at the first step of a 100-step run: the rule says so
    compiled = _trial("tuned", [[0.52, 0.51, 0.53] * 3, [0.52, 0.52, 0.51] * 3], first=100.0)
    hand = tuner._hand_over(compiled, written, written, 100.0)
    assert not hand["passed"]
    assert "projected 151.5 s against 100.0 s (first step 99.5 s" in hand["why"]["final check"]
    batch = 256
    result = {"tuned": throughput(compiled, batch), "as_written": throughput(written, batch), "min_gain": 0.05,
              "searched_overrides": ["trainer.compile=true"], "tuned_overrides": [], "decisions": {}, "speedup": 1.9,
              "handover": hand, "busy": []}
    text = summary(result)
    assert text.startswith("Nothing beat the recipe as written by 5% on this machine")
    assert "first step 99.5 s" in text and "1.9" in text


def test_a_figure_the_interval_does_not_support_is_not_a_headline():
    result = {"tuned": {"samples_per_s": 1100.0, "low": 171.0, "high": 2027.0},
              "as_written": {"samples_per_s": 135.0, "low": 130.0, "high": 140.0}, "min_gain": 0.05,
              "searched_overrides": ["trainer.threads=2"], "tuned_overrides": ["trainer.threads=2"],
              "decisions": {"threads": "2 threads"}, "speedup": 8.1, "busy": []}
    text = summary(result)
    assert "too noisy to put a figure on it" in text and "rerun when it is idle" in text and "8.15x the" not in text
    steady = dict(result, tuned={"samples_per_s": 270.0, "low": 265.0, "high": 275.0})
    assert "2.00x the recipe's throughput on this machine, interval [1.89, 2.12]" in summary(steady)


def test_a_busy_machine_stops_the_search_in_one_line_after_three_tries(monkeypatch):
    tuner = _tuner()
    tuner.busy = []
    calls = []
    monkeypatch.setattr(Tuner, "_trial_once", lambda self, *a: calls.append(a) or {"status": "ok", "others_share": 0.6})
    with pytest.raises(BusyMachineError, match="the machine was busy: other processes used 60% of its cores"):
        tuner.run_trial([], "as written")
    assert len(calls) == 3
    monkeypatch.setattr(Tuner, "_trial_once", lambda self, *a: {"status": "ok", "others_share": 0.05})
    assert tuner.run_trial([], "as written")["others_share"] == 0.05


def _scripted(monkeypatch, screen: dict, verified: dict):
    """The method stage's bench runs replaced by scripted analyses: screen speed-ups by label,
    and verified (ratio, low, high, reached) by label."""
    rounds = []

    def run_comparison(specs, seeds, folder, cap, console, metric=None):
        rounds.append(([s.label for s in specs], seeds))
        return []

    def analyse(runs, labels, target):
        out = {"target": "val/acc>=0.8", "recipes": {}}
        verify = len(rounds[-1][1]) > 1
        for label in labels:
            if label == "systems-tuned":
                out["recipes"][label] = {"reached": 1, "runs": 3 if verify else 1, "median_time_to_target_s": 100.0,
                                         "final_metric": {"mean": 0.8}, "speedup_time_to_target": {}}
            elif verify:
                ratio, low, high, reached = verified[label]
                out["recipes"][label] = {"reached": reached, "runs": 3, "median_time_to_target_s": 100.0 / ratio,
                                         "final_metric": {"mean": 0.81},
                                         "speedup_time_to_target": {"ratio": ratio, "low": low, "high": high}}
            elif screen[label] == "failed":   # its run failed: nothing counted, the error reported
                out["recipes"][label] = {"reached": 0, "runs": 0, "median_time_to_target_s": None,
                                         "final_metric": None, "speedup_time_to_target": {}}
                out.setdefault("failed", []).append({"label": label, "seed": 0, "error": "hasten: error: bad override"})
            else:   # a speed-up, or (speed-up, final quality)
                s, final = screen[label] if isinstance(screen[label], tuple) else (screen[label], 0.8)
                out["recipes"][label] = {"reached": 1 if s else 0, "runs": 1,
                                         "median_time_to_target_s": 100.0 / s if s else None,
                                         "final_metric": {"mean": final}, "speedup_time_to_target": {}}
        return out
    monkeypatch.setattr(methods_mod, "run_comparison", run_comparison)
    monkeypatch.setattr(methods_mod, "analyse", analyse)
    return rounds


def test_the_method_stage_hands_over_only_a_verified_winner_whose_interval_clears_one(monkeypatch, tmp_path):
    recipe = load_recipe("cifar10-baseline")
    labels = [c.label for c in methods_mod.candidates(recipe, {"conv2d": True})]
    screen = {lab: 0.9 for lab in labels}
    screen.update({"EMA": 1.4, "Muon": 1.3, "learning rate x1.5": 1.2})
    verified = {"EMA": (1.35, 1.10, 1.60, 3), "Muon": (1.5, 0.0, 2.1, 3), "learning rate x1.5": (1.2, 1.05, 1.4, 2)}
    rounds = _scripted(monkeypatch, screen, verified)
    from hasten.tasks import TASKS
    rec = methods_mod.method_stage("cifar10-baseline", [], [], recipe, {"conv2d": True}, budget_s=10_000, run_s=100,
                                   samples_per_run=50_000, out=tmp_path, console=None,
                                   quality=TASKS["image_classification"].quality)
    assert rounds[0][1] == [0] and rounds[1][1] == [0, 1, 2]
    assert set(rounds[1][0]) == {"systems-tuned", "EMA", "Muon", "learning rate x1.5"}
    assert rec["handed_over"] == ["EMA"]   # Muon's interval holds 1; the lr's runs did not all reach the target
    assert rec["verify_command"] is None   # every promising one was verified: nothing left to verify
    md = "\n".join(methods_mod.render(rec))
    assert "| EMA | 1.40x | 3/3 | 1.35x [1.10, 1.60] | **handed over** |" in md
    assert "| Muon | 1.30x | 3/3 | 1.50x [0.00, 2.10] | not faster |" in md   # an interval from 0 is shown, not hidden


def test_a_budget_that_holds_only_the_screen_hands_nothing_over_and_says_how_to_verify(monkeypatch, tmp_path):
    recipe = load_recipe("cifar10-baseline")
    labels = [c.label for c in methods_mod.candidates(recipe, {"conv2d": True})]
    rounds = _scripted(monkeypatch, {lab: (1.3 if lab == "label smoothing 0.1" else 0.8) for lab in labels}, {})
    from hasten.tasks import TASKS
    rec = methods_mod.method_stage("cifar10-baseline", [], [], recipe, {"conv2d": True}, budget_s=600,
                                   run_s=100, samples_per_run=50_000, out=tmp_path, console=None,
                                   quality=TASKS["image_classification"].quality)
    assert len(rounds) == 1 and rounds[0][0] == ["systems-tuned", "label smoothing 0.1", "progressive resizing"]
    assert rec["handed_over"] == [] and len(rec["left_out"]) == len(labels) - 2
    md = "\n".join(methods_mod.render(rec))
    assert "screened only: verify it" in md
    assert ("To verify the promising ones: `hasten bench cifar10-baseline "
            "'cifar10-baseline+algorithms.label_smoothing={smoothing: 0.1}' --eval-every 5000sp --seeds 3`") in md
    # the report says what budget screens every candidate
    assert "The screen's target is the systems-tuned run's own final quality, 0.8, which it reached in 100 s" in md
    stage_s = (len(labels) + 1) * 100 / methods_mod.SCREEN_SHARE   # 100 s a run, the screen's share of the stage
    assert f"a --budget of about {-(-stage_s / (1 - methods_mod.SYSTEMS_SHARE) // 60):.0f} min screens every" in md


def test_a_screen_that_missed_gives_its_quality_and_one_that_failed_its_error(monkeypatch, tmp_path):
    recipe = load_recipe("cifar10-baseline")
    labels = [c.label for c in methods_mod.candidates(recipe, {"conv2d": True})]
    outcome = {"label smoothing 0.1": 0, "progressive resizing": "failed"}
    _scripted(monkeypatch, {lab: outcome.get(lab, 0.8) for lab in labels}, {})
    from hasten.tasks import TASKS
    rec = methods_mod.method_stage("cifar10-baseline", [], [], recipe, {"conv2d": True}, budget_s=600,
                                   run_s=100, samples_per_run=50_000, out=tmp_path, console=None,
                                   quality=TASKS["image_classification"].quality)
    md = "\n".join(methods_mod.render(rec))
    assert rec["handed_over"] == [] and rec["verify_command"] is None
    assert "| label smoothing 0.1 | missed the target (0.8) | - | - | missed the target |" in md, md
    assert "| progressive resizing | failed: hasten: error: bad override | - | - | not measured: its run failed |" in md


def test_the_verify_command_names_only_what_was_screened_and_not_verified(monkeypatch, tmp_path):
    """The user ResNet's rerun: Muon and the schedule verified, label smoothing and EMA won their
    screens only; the command the report gives verifies those two, not the two already verified."""
    recipe = load_recipe("cifar10-baseline")
    labels = [c.label for c in methods_mod.candidates(recipe, {"conv2d": True})]
    screen = {lab: 0.9 for lab in labels}
    screen.update({"Muon": 1.22, "warm-up/stable/decay schedule": 1.14, "EMA": 1.13, "label smoothing 0.1": 1.07})
    verified = {"Muon": (1.19, 0.99, 1.37, 3), "warm-up/stable/decay schedule": (1.0, 0.82, 1.14, 3)}
    _scripted(monkeypatch, screen, verified)
    from hasten.tasks import TASKS
    rec = methods_mod.method_stage("cifar10-baseline", ["data.path=x.zip"], ["trainer.precision=bf16-mixed"], recipe,
                                   {"conv2d": True}, budget_s=1200, run_s=100, samples_per_run=50_000,
                                   out=tmp_path, console=None, quality=TASKS["image_classification"].quality)
    assert rec["handed_over"] == []
    by_label = {c.label: c.overrides for c in methods_mod.candidates(recipe, {"conv2d": True})}
    verified_now = [c["label"] for c in rec["candidates"] if c["verified"]]
    assert set(verified_now) == set(verified)
    cmd = rec["verify_command"]
    assert cmd.startswith("hasten bench cifar10-baseline ") and cmd.endswith(" --seeds 3")
    for label in ("EMA", "label smoothing 0.1"):
        assert "+".join(by_label[label]) in cmd
    for label in ("Muon", "warm-up/stable/decay schedule"):
        assert "+".join(by_label[label]) not in cmd
    assert " data.path=x.zip trainer.precision=bf16-mixed --eval-every 5000sp" in cmd


def test_a_method_that_ends_better_but_no_sooner_is_screened_again_with_a_shorter_run(monkeypatch, tmp_path):
    """Muon on the user's ResNet ended at 73.6% against 66.8% and reached 66.0% no sooner: a
    decaying schedule lifts quality at its end. The same method over 0.6x the run is screened."""
    recipe = load_recipe("cifar10-baseline")
    labels = [c.label for c in methods_mod.candidates(recipe, {"conv2d": True})]
    screen = {lab: 0.9 for lab in labels}
    screen.update({"Muon": (0.95, 0.85), "warm-up/stable/decay schedule": (0.9, 0.805),   # 6% better; 0.6% better
                   "Muon, 0.6x the run": 1.6})
    rounds = _scripted(monkeypatch, screen, {"Muon, 0.6x the run": (1.55, 1.2, 1.9, 3)})
    from hasten.tasks import TASKS
    rec = methods_mod.method_stage("cifar10-baseline", [], [], recipe, {"conv2d": True}, budget_s=1000, run_s=100,
                                   samples_per_run=50_000, out=tmp_path, console=None,
                                   quality=TASKS["image_classification"].quality)
    assert [r[0][1:] for r in rounds] == [labels[:4], ["Muon, 0.6x the run"], ["Muon, 0.6x the run"]]
    shorter = methods_mod._scaled(recipe.trainer.max_duration, 0.6)
    assert rec["handed_over"] == ["Muon, 0.6x the run"] and rec["overrides"][-1] == f"trainer.max_duration={shorter}"
    md = "\n".join(methods_mod.render(rec))
    assert "| Muon | 0.95x | - | - | not faster |" in md and "| Muon, 0.6x the run | 1.60x | 3/3 | 1.55x [1.20, 1.90] |" in md


def test_no_shorter_run_when_it_would_leave_no_room_to_verify(monkeypatch, tmp_path):
    recipe = load_recipe("cifar10-baseline")
    labels = [c.label for c in methods_mod.candidates(recipe, {"conv2d": True})]
    screen = {lab: 0.9 for lab in labels}
    screen["Muon"] = (0.95, 0.85)
    rounds = _scripted(monkeypatch, screen, {})
    from hasten.tasks import TASKS
    rec = methods_mod.method_stage("cifar10-baseline", [], [], recipe, {"conv2d": True}, budget_s=800, run_s=100,
                                   samples_per_run=50_000, out=tmp_path, console=None,
                                   quality=TASKS["image_classification"].quality)
    assert len(rounds) == 1 and rec["not_shortened"] == ["Muon, 0.6x the run"]
    assert "not screened again with a shorter run (the budget): Muon, 0.6x the run" in "\n".join(methods_mod.render(rec))


# ---------------------------------------------------------------------------- the user's path
def test_a_factory_refuses_the_device_loaders_settings(user_model):
    with pytest.raises(ConfigError, match="data.loader=device needs hasten's own dataset"):
        from hasten.build import build_run
        build_run(load_recipe("cifar10-baseline", ["data.factory=byom:MyResNet", "data.loader=device",
                                                   f"trainer.run_dir={user_model / 'r'}"]))


class Flippy(torch.utils.data.Dataset):
    """A user's dataset that augments with the global generator inside __getitem__."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        x = torch.full((4,), float(i))
        if torch.rand(()) < 0.5:
            x = -x
        return x + torch.rand(4) * 0.01, i % 2


def test_a_users_augmentation_in_workers_resumes_exactly():
    from hasten.data import make_dataloader
    from hasten.data.resumable import epoch_iterator
    straight = [b[0] for b in epoch_iterator(make_dataloader(Flippy(), 4, seed=3, num_workers=2, seed_samples=True), 3, 1)]
    resumed = [b[0] for b in epoch_iterator(make_dataloader(Flippy(), 4, seed=3, num_workers=2, seed_samples=True), 3, 1,
                                            skip_batches=4)]
    assert len(resumed) == len(straight) - 4
    assert all(torch.equal(a, b) for a, b in zip(straight[4:], resumed))
    other_workers = [b[0] for b in epoch_iterator(make_dataloader(Flippy(), 4, seed=3, num_workers=0, seed_samples=True),
                                                  3, 1)]
    assert all(torch.equal(a, b) for a, b in zip(straight, other_workers))   # whatever the worker count


def test_micro_batching_that_changes_what_batch_norm_sees_says_so():
    from test_microbatch import _fit, _saved_bytes
    limit = (_saved_bytes(4) + _saved_bytes(8)) // 2
    with pytest.warns(UserWarning, match="batch norm now normalises over 8 samples, not the batch of 16"):
        _fit(microbatch="auto", memory_limit=limit)


def test_the_profile_ends_with_what_its_numbers_point_to():
    from hasten.callbacks.profile import advice
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    result = {"shares": {"data": 0.3, "optimizer": 0.05}, "device": "cpu", "precision": "fp32",
              "top_operators": [{"name": "aten::copy_", "share_of_self_cpu": 0.18},
                                {"name": "aten::convolution_backward", "share_of_self_cpu": 0.3}]}
    tips = advice(result, net)
    assert len(tips) == 2 and "channels-last" in tips[0] and "18%" in tips[0] and "waits for data 30%" in tips[1]
    assert advice(result, net.to(memory_format=torch.channels_last))[0].startswith("the step waits for data")


@pytest.mark.parametrize("recipe_arg", ["cifar10-baseline", "cifar10-narrow", "prose-gpt-baseline", "shakespeare-char-baseline",
                                        str(Path(__file__).resolve().parent.parent / "benchmarks" / "comparisons" / "recipes"
                                            / "user-resnet.yaml")])
def test_every_candidate_method_is_a_valid_recipe(recipe_arg):
    """A candidate that the recipe's own settings refuse (Muon beside an SGD recipe's optimizer.sgd)
    would fail its screen in seconds and never be measured."""
    recipe = load_recipe(recipe_arg)
    facts = {"conv2d": recipe.task in ("image_classification", "classification"),
             "embedding": recipe.task not in ("image_classification", "classification")}
    cands = methods_mod.candidates(recipe, facts)
    assert cands
    for c in cands:
        load_recipe(recipe_arg, c.overrides)   # raises ConfigError on a refused override
