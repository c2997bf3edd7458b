"""One trust rule for code a recipe names, whatever the entry path: the code is imported only
when every file that named it (a recipe file, a file of its `base:` chain, a run folder's
recipe.yaml or resumes.jsonl, an artifact) is this user's, or --trust-code was given; the
flag reaches bench's and tune's worker processes through the environment."""
import json
import os
import sys
import textwrap

import pytest
import yaml

from hasten.config import load_recipe
from hasten.errors import ConfigError
from hasten.runs import stored_recipe
from hasten.usercode import TRUST_ENV, trusted, trusting

from helpers.tiny import run_cli

OTHER_UID = 4242
CODE = '''
import pathlib
import torch
from torch.utils.data import Dataset

pathlib.Path("IMPORTED").write_text("the module ran")   # what importing it does: visible to the test

class Net(torch.nn.Module):
    def __init__(self, width=8, num_classes=2):
        super().__init__()
        self.body = torch.nn.Linear(4, num_classes)

    def forward(self, x):
        return self.body(x)

class Pairs(Dataset):
    classes = ["no", "yes"]

    def __len__(self):
        return 16

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(4, generator=g)
        return x, int(x[0] > 0)

def data():
    return Pairs(), Pairs()
'''


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    if not hasattr(os, "getuid") or os.getuid() != 0:
        pytest.skip("making a file another user's takes root (CI runs as root)")
    (tmp_path / "theirpkg").mkdir()
    (tmp_path / "theirpkg" / "__init__.py").write_text("")
    (tmp_path / "theirpkg" / "code.py").write_text(textwrap.dedent(CODE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(TRUST_ENV, raising=False)
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("theirpkg")]:
        del sys.modules[name]


def _write(path, raw, theirs=False):
    path.write_text(yaml.safe_dump(raw))
    if theirs:
        os.chown(path, OTHER_UID, -1)
    return path


def _recipe(**sections):
    raw = {"task": "classification", "name": "r",
           "model": {"name": "theirpkg.code:Net"},
           "data": {"factory": "theirpkg.code:data", "batch_size": 8, "eval_batch_size": 8, "num_workers": 0},
           "trainer": {"max_duration": "2ba", "progress_bar": False, "tensorboard": False, "checkpoints": False}}
    raw.update(sections)
    return raw


def _refused(r, pkg):
    assert r.returncode == 2, r.stdout + r.stderr
    assert "belongs to another user (uid 4242)" in r.stderr and "--trust-code" in r.stderr, r.stderr
    assert not (pkg / "IMPORTED").exists()   # refused before the module was imported


def test_another_users_recipe_file_is_refused_and_runs_with_trust_code(pkg):
    _write(pkg / "theirs.yaml", _recipe(), theirs=True)
    _refused(run_cli("train", "theirs.yaml", "trainer.run_dir=runs/a"), pkg)
    assert not (pkg / "runs/a").exists()
    r = run_cli("train", "theirs.yaml", "trainer.run_dir=runs/b", "--trust-code")
    assert r.returncode == 0, r.stderr
    assert (pkg / "IMPORTED").exists()


def test_the_side_door_autoresume_on_another_users_run_folder_is_refused(pkg):
    assert run_cli("train", str(_write(pkg / "mine.yaml", _recipe())), "trainer.run_dir=theirs",
                   "trainer.checkpoints=true").returncode == 0
    (pkg / "IMPORTED").unlink()
    for name in [m for m in sys.modules if m.startswith("theirpkg")]:
        del sys.modules[name]
    os.chown(pkg / "theirs" / "recipe.yaml", OTHER_UID, -1)   # the run folder is now another user's
    _refused(run_cli("train", "theirs/recipe.yaml", "trainer.run_dir=theirs", "trainer.autoresume=true",
                     "trainer.max_duration=4ba"), pkg)
    _refused(run_cli("train", "--resume", "theirs", "trainer.max_duration=4ba"), pkg)


def test_a_base_chain_file_of_another_user_is_refused_for_the_code_it_names(pkg):
    _write(pkg / "theirs.yaml", _recipe(), theirs=True)
    _write(pkg / "mine.yaml", {"base": "theirs.yaml", "trainer": {"max_duration": "1ba"}})
    assert load_recipe("mine.yaml").origins == {"model.name": str(pkg / "theirs.yaml"),
                                                "data.factory": str(pkg / "theirs.yaml")}
    _refused(run_cli("train", "mine.yaml", "trainer.run_dir=runs/a"), pkg)
    # the code named in my file or on my command line is mine to name, whatever the base holds
    _write(pkg / "mine.yaml", {"base": "theirs.yaml", "model": {"name": "theirpkg.code:Net"}})
    assert load_recipe("mine.yaml", ["data.factory=theirpkg.code:data"]).origins == {"model.name": str(pkg / "mine.yaml")}


def test_code_named_by_a_run_folders_recorded_resume_counts_as_named_by_that_folder(pkg):
    folder = pkg / "run"
    folder.mkdir()
    _write(folder / "recipe.yaml", _recipe(model={"name": "mlp"}))
    (folder / "resumes.jsonl").write_text(json.dumps({"overrides": ['model.name="theirpkg.code:Net"']}) + "\n")
    assert stored_recipe(folder).origins["model.name"] == str(folder / "resumes.jsonl")
    assert "model.name" not in stored_recipe(folder, ["model.name=theirpkg.code:Net"]).origins


def test_trust_code_reaches_the_workers_through_the_environment(pkg, monkeypatch):
    """bench and tune start workers that load the recipe again: --trust-code sets the variable they read."""
    from hasten.bench import worker
    _write(pkg / "theirs.yaml", _recipe(), theirs=True)
    spec = pkg / "spec.json"
    spec.write_text(json.dumps({"recipe": "theirs.yaml", "overrides": [], "seed": 0, "run_dir": str(pkg / "w")}))
    assert not trusted()
    with pytest.raises(ConfigError, match="another user"):
        worker.main(str(spec), str(pkg / "out.jsonl"))
    assert not (pkg / "IMPORTED").exists()
    with trusting():
        assert trusted()
    monkeypatch.setenv(TRUST_ENV, "1")   # what `hasten bench --trust-code` leaves its workers
    assert worker.main(str(spec), str(pkg / "out2.jsonl")) == 0
    assert (pkg / "IMPORTED").exists()


def test_bench_and_tune_take_trust_code(pkg):
    _write(pkg / "theirs.yaml", _recipe(), theirs=True)
    r = run_cli("bench", "theirs.yaml", "--seeds", "1", "--out", "b")
    assert r.returncode != 0 and "another user" in r.stdout + r.stderr
    assert not (pkg / "IMPORTED").exists()
