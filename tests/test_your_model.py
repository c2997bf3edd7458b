"""A user's own model and data from a recipe, in the harness too; the trust rule for code a
stored recipe names; model outputs of Hugging Face models; methods that cannot act are
refused, never silent; the small things a user meets first (docstrings, the EMA functional
form's names, fit()'s summary, SpeedMonitor alone, MLflow and W&B loggers)."""
import inspect
import json
import os
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.utils.data import DataLoader, TensorDataset

import hasten.functional as hf
from hasten import Trainer
from hasten.algorithms import BlurPool, ChannelsLast, DiracInit, GhostBatchNormAlgorithm, LabelSmoothing, TTA
from hasten.callbacks import SpeedMonitor
from hasten.errors import ConfigError
from hasten.loss import logits_of
from hasten.usercode import check_trust

from helpers.tiny import loader, model_and_twin, run_cli

USER_CODE = '''
import torch
from torch.utils.data import Dataset

class Net(torch.nn.Module):
    def __init__(self, width, num_classes):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, width), torch.nn.ReLU(), torch.nn.Linear(width, num_classes))

    def forward(self, x):
        return self.body(x)

class Pairs(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 0).long()
        self.classes = ["a", "b", "c"]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

def data(n_train, seed):
    return Pairs(n_train, seed), Pairs(64, seed + 1)

def not_pairs(**kw):
    return 3

def broken(**kw):
    raise RuntimeError("the disk is full")
'''


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(textwrap.dedent(USER_CODE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]


def _recipe(path, **extra):
    raw = {"task": "classification", "name": "mine",
           "model": {"name": "mypkg.models:Net", "width": 16},
           "data": {"factory": "mypkg.models:data", "factory_args": {"n_train": 1024}, "batch_size": 32,
                    "eval_batch_size": 64, "num_workers": 0},
           "optimizer": {"name": "adamw", "lr": 0.03},
           "trainer": {"max_duration": "3ep", "eval_interval": "1ep", "progress_bar": False, "tensorboard": False}}
    for key, value in extra.items():
        section, _, field = key.partition("__")
        raw[section][field] = value
    path.write_text(yaml.safe_dump(raw))
    return path


# ---------------------------------------------------------------------------- your model and data
def test_a_users_module_and_data_train_from_a_recipe_and_learn(user_pkg):
    recipe = _recipe(user_pkg / "mine.yaml")
    r = run_cli("train", str(recipe), "trainer.run_dir=runs/mine", cwd=user_pkg)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (user_pkg / "runs/mine/metrics.jsonl").read_text().splitlines()]
    accs = [row["val/acc"] for row in rows if "val/acc" in row]
    assert len(accs) == 3 and accs[-1] > 0.7   # three classes: 0.33 by chance
    assert yaml.safe_load((user_pkg / "runs/mine/recipe.yaml").read_text())["model"]["name"] == "mypkg.models:Net"


@pytest.mark.parametrize("change, message", [
    ({"model__name": "nopkg.models:Net"}, "cannot import 'nopkg.models'"),
    ({"model__name": "mypkg.models:Nope"}, "has no attribute 'Nope'"),
    ({"model__name": "mypkg.models:"}, "not an import path"),
    ({"model__width": "wide"}, "mypkg.models:Net raised TypeError"),
    ({"data__factory": "mypkg.models:not_pairs"}, "returned a int"),
    ({"data__factory": "mypkg.models:broken"}, "raised RuntimeError: the disk is full"),
    ({"data__factory_args": {"n_train": 8, "colour": 1}}, "unexpected keyword argument 'colour'"),
])
def test_a_users_code_that_does_not_fit_is_one_line_naming_the_path(user_pkg, change, message):
    recipe = _recipe(user_pkg / "bad.yaml", **change)
    r = run_cli("train", str(recipe), "trainer.run_dir=runs/bad", cwd=user_pkg)
    assert r.returncode == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("hasten: error:") and message in line, r.stderr
    assert "Traceback" not in r.stderr


def test_a_missing_constructor_argument_is_named(user_pkg):
    raw = yaml.safe_load(_recipe(user_pkg / "r.yaml").read_text())
    raw["model"] = {"name": "mypkg.models:Net"}   # width missing
    (user_pkg / "r.yaml").write_text(yaml.safe_dump(raw))
    r = run_cli("train", str(user_pkg / "r.yaml"), "trainer.run_dir=runs/r", cwd=user_pkg)
    assert r.returncode == 2 and "missing a required argument: 'width'" in r.stderr


def test_the_harness_compares_a_users_recipe(user_pkg):
    recipe = _recipe(user_pkg / "mine.yaml")
    r = run_cli("bench", str(recipe), f"{recipe}+optimizer.lr=0.003", "--seeds", "1", "--out", "b", "--name", "mine",
                "--target", "val/acc>=0.4", cwd=user_pkg)
    assert r.returncode == 0, r.stderr
    report = json.loads((user_pkg / "b/mine/report.json").read_text())
    assert len(report["recipes"]) == 2


def test_bench_compare_takes_trainer_factories_and_reports_like_hasten_bench(tmp_path):
    def arm(lr):
        def make(seed):
            torch.manual_seed(seed)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
            return Trainer(model, loader(256, 32), eval_dataloader=loader(256, 64),
                           optimizers=torch.optim.SGD(model.parameters(), lr=lr), max_duration="4ep",
                           eval_interval="1ep", seed=seed)
        return make

    from hasten.bench import compare
    report = compare({"slow": arm(0.02), "fast": arm(0.2)}, seeds=2, target="val/loss<=@first-worst",
                     out=tmp_path / "cmp", quiet=True)
    assert set(report["recipes"]) == {"slow", "fast"}
    assert (tmp_path / "cmp/report.md").exists() and (tmp_path / "cmp/runs.jsonl").exists()
    fast = report["recipes"]["fast"]
    assert fast["reached"] == 2   # ten times the learning rate reaches the slow arm's worst loss
    again = compare({"slow": arm(0.02), "fast": arm(0.2)}, seeds=2, target="val/loss<=@first-worst",
                    out=tmp_path / "cmp", quiet=True)   # continues: nothing to run
    assert again["recipes"]["fast"]["reached"] == 2
    assert len((tmp_path / "cmp/runs.jsonl").read_text().splitlines()) == 4


# ---------------------------------------------------------------------------- trust
def test_code_a_stored_recipe_names_is_announced_and_another_users_folder_refused(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "recipe.yaml").write_text("x")
    said = []
    check_trust(folder / "recipe.yaml", {"model": {"name": "mypkg.models:Net"}}, False, "resuming run", said.append)
    assert "imports mypkg.models:Net" in said[0]
    check_trust(folder / "recipe.yaml", {"model": {"name": "gpt"}}, False, "resuming run", said.append)
    assert len(said) == 1   # no code named: nothing to say
    monkeypatch.setattr(os, "getuid", lambda: os.stat(folder).st_uid + 1)   # the folder is now someone else's
    with pytest.raises(ConfigError, match="another user.*--trust-code"):
        check_trust(folder / "recipe.yaml", {"data": {"factory": "evil:run"}}, False, "resuming run", said.append)
    check_trust(folder / "recipe.yaml", {"data": {"factory": "evil:run"}}, True, "resuming run", said.append)
    assert "evil:run" in said[-1]


def test_resume_of_a_run_that_names_code_says_so_first(user_pkg):
    recipe = _recipe(user_pkg / "mine.yaml", trainer__max_duration="1ep")
    assert run_cli("train", str(recipe), "trainer.run_dir=runs/m", cwd=user_pkg).returncode == 0
    r = run_cli("train", "--resume", "runs/m", "trainer.max_duration=2ep", cwd=user_pkg)
    assert r.returncode == 0, r.stderr
    assert "imports mypkg.models:Net, mypkg.models:data" in r.stderr + r.stdout


# ---------------------------------------------------------------------------- model outputs and refusals
def test_a_hugging_face_vit_trains_in_the_trainer_with_label_smoothing_and_tta():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    vit = transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    x, y = torch.randn(32, 3, 16, 16), torch.randint(0, 3, (32,))
    dl = DataLoader(TensorDataset(x, y), batch_size=32)
    seen = []

    def loss_fn(outputs, targets):   # training: the ModelOutput; evaluation under TTA: its logits
        if not isinstance(outputs, torch.Tensor):
            seen.append(outputs.logits.detach())
        return F.cross_entropy(logits_of(outputs), targets, reduction="none")
    t = Trainer(vit, dl, eval_dataloader=dl, loss_fn=loss_fn, max_duration="1ba", algorithms=[LabelSmoothing(0.1), TTA()])
    t.fit(summary=False)
    # the training loss is PyTorch's label-smoothed cross-entropy of the first forward's logits
    assert torch.isfinite(torch.tensor(t.state.eval_metrics["val/loss"]))
    ref = F.cross_entropy(seen[0], y, label_smoothing=0.1)
    smoothed = LabelSmoothing(0.1).wrap_loss(loss_fn)(type("Out", (), {"logits": seen[0]})(), y).mean()
    torch.testing.assert_close(smoothed, ref)


@pytest.mark.parametrize("algorithm, words", [
    (BlurPool(), "no strided convolution"), (ChannelsLast(), "no 2-D convolutions"),
    (DiracInit(), "no ungrouped, stride-1 convolution"), (GhostBatchNormAlgorithm(), "no batch-norm layers"),
])
def test_a_method_with_nothing_to_act_on_is_refused_not_silent(algorithm, words):
    model, _ = model_and_twin()
    with pytest.raises(ValueError, match=words):
        Trainer(model, loader(), max_duration="1ba", algorithms=[algorithm])


# ---------------------------------------------------------------------------- what a user meets first
def test_every_functional_form_has_a_docstring():
    missing = [n for n in hf.__all__ if not (inspect.getdoc(getattr(hf, n)) or "").strip()
               or (inspect.isclass(getattr(hf, n)) and getattr(hf, n).__doc__ is None)]
    assert not missing, missing


def test_ema_update_names_the_decay_and_the_share_apart():
    ema, new = [torch.zeros(3)], [torch.ones(3)]
    hf.ema_update(ema, new, decay=0.9)
    torch.testing.assert_close(ema[0], torch.full((3,), 0.1))
    hf.ema_update(ema, new, share=hf.ema_share(0.9, 1))   # bias-corrected first update: a copy
    torch.testing.assert_close(ema[0], torch.ones(3))
    with pytest.raises(TypeError, match="decay= .* or share="):
        hf.ema_update(ema, new, decay=0.9, share=0.1)
    with pytest.raises(TypeError):
        hf.ema_update(ema, new, 0.9)   # positional: which one was meant cannot be told


def test_fit_ends_with_a_one_line_summary_on_stderr(capsys):
    model, _ = model_and_twin()
    Trainer(model, loader(), eval_dataloader=loader(), max_duration="2ba").fit()
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("hasten: trained 2 batches (16 samples)") and "val/loss=" in err[-1]
    Trainer(model, loader(), max_duration="1ba").fit(summary=False)
    assert "hasten: trained" not in capsys.readouterr().err


def test_speed_monitor_alone_prints_throughput(capsys):
    model, _ = model_and_twin()
    Trainer(model, loader(n=64), max_duration="8ba", log_interval="4ba",
            callbacks=[SpeedMonitor(flops_per_sample=1e3, peak_flops=1e9)]).fit(summary=False)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("batch ")]
    assert len(lines) == 2 and "samples/s" in lines[0] and "MFU" in lines[0]


def test_mlflow_logger_writes_metrics_and_the_recipe_to_a_real_sqlite_store(tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    pytest.importorskip("alembic")
    from mlflow.tracking import MlflowClient
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = tmp_path / "lm.yaml"
    cfg.write_text((__import__("pathlib").Path(__file__).parent / "helpers/tiny_lm.yaml").read_text())
    r = run_cli("train", str(cfg), f"trainer.run_dir={tmp_path / 'run'}", "trainer.max_duration=4ba",
                "trainer.eval_interval=2ba", "trainer.log_interval=2ba", "--no-progress",
                f"trainer.mlflow={{tracking_uri: '{uri}', experiment: tests}}")
    assert r.returncode == 0, r.stderr
    client = MlflowClient(uri)
    run_id = json.loads((tmp_path / "run/trackers.json").read_text())["mlflow"]
    history = client.get_metric_history(run_id, "val/loss")
    assert [m.step for m in history] == [2, 4]
    local = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert history[-1].value == pytest.approx([row for row in local if "val/loss" in row][-1]["val/loss"])
    run = client.get_run(run_id)
    assert run.data.params["task"] in ("char_lm", "lm") and run.info.status == "FINISHED"


def test_wandb_logger_in_offline_mode(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    from hasten.loggers import WandbLogger
    logger = WandbLogger(project="hasten-tests", mode="offline", dir=str(tmp_path))
    logger.log_hparams({"optimizer": {"lr": 0.1}})
    logger.log_metrics({"val/loss": 1.5}, 2)
    logger.log_metrics({"val/loss": 1.25}, 4)
    logger.log_metrics({"train/loss": 1.0}, 3)   # a resumed run logs an earlier step again: kept in order
    assert logger.run.summary["val/loss"] == 1.25 and logger.run.config["optimizer"]["lr"] == 0.1
    logger.close()
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
