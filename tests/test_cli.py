"""The command line as a user runs it."""
import json
import subprocess
import sys


import pytest

from hasten import __version__
from hasten.cli import main

from tiny import run_cli


def _hasten(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "hasten.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_version_and_recipes(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and __version__ in capsys.readouterr().out
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert "shakespeare-char-baseline" in out and "cifar10-baseline" in out


def test_version_is_answered_without_importing_torch_and_matches_the_package():
    # the command's entry point answers --version from the package metadata; it must be the
    # version hasten itself reports, and it must not pay torch's import (a second or two)
    from importlib.metadata import version
    assert version("hasten") == __version__
    code = ("import sys; sys.argv = ['hasten', '--version']; import hasten_entry; rc = hasten_entry.main(); "
            "print('torch' in sys.modules, rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"hasten {__version__}", "False 0"]


def test_python_dash_m_hasten_is_the_command():
    """`python -m hasten` runs the same command line (for a scripts folder not on PATH)."""
    r = subprocess.run([sys.executable, "-m", "hasten", "recipes"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "cifar10-fast " in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "hasten", "train", "trainer.max_duraton=3ba"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("hasten: error: unknown key 'trainer.max_duraton'"), r.stderr


def test_train_short_run_prints_results_and_paths(tmp_path):
    r = run_cli("train", "trainer.max_duration=30ba", "trainer.eval_interval=15ba", "data.batch_size=4",
                "model.n_layer=1", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "final val/loss=" in r.stdout and "checkpoint: runs/shakespeare-char-baseline-" in r.stdout
    run = next((tmp_path / "runs").iterdir())
    assert (run / "recipe.yaml").is_file() and (run / "metrics.jsonl").is_file()
    assert (run / "checkpoints" / "ep0-ba30.pt").is_file()
    # every evaluation says when it happened in training time (quality against time)
    evals = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "val/loss" in r]
    assert [r["step"] for r in evals] == [15, 30]
    assert 0 < evals[0]["time/train_seconds_at_eval"] < evals[1]["time/train_seconds_at_eval"]


def test_train_config_errors_exit_2(tmp_path, capsys):
    assert main(["train", "trainer.max_duraton=3ba"]) == 2
    assert "Did you mean 'max_duration'" in capsys.readouterr().err
    assert main(["train", "no-such-recipe"]) == 2


def test_missing_dataset_is_a_clear_error(tmp_path, capsys):
    code = main(["train", "cifar10-baseline", f"data.path={tmp_path}/absent", "--no-progress"])
    assert code == 1 and "no CIFAR-10 at" in capsys.readouterr().err


def test_print_config(capsys):
    assert main(["train", "shakespeare-char-baseline", "optimizer.lr=0.01", "--print-config"]) == 0
    assert "lr: 0.01" in capsys.readouterr().out


def test_cifar_baseline_smoke_on_tiny_generated_data(tmp_path):
    import io
    import zipfile

    import numpy as np
    from PIL import Image
    from hasten.data.cifar import CLASSES
    path = tmp_path / "tiny.zip"
    rng = np.random.default_rng(0)
    with zipfile.ZipFile(path, "w") as zf:
        for split, n in (("train", 40), ("test", 20)):
            for i in range(n):
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, format="PNG")
                zf.writestr(f"{split}/{CLASSES[i % 10]}/{i:05d}.png", buf.getvalue())
    r = run_cli("train", "cifar10-baseline", f"data.path={path}", "data.batch_size=8", "data.num_workers=0",
                "model.width=4", "trainer.max_duration=2ep", "schedule.warmup=1ep", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "val/acc=" in r.stdout


def _tiny_official_cifar(path, n=24):
    """A CIFAR-10 folder in the official batch format, with n images per batch."""
    import pickle

    import numpy as np
    rng = np.random.default_rng(0)
    path.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        with open(path / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": rng.integers(0, 10, n).tolist()}, f)
    return path


@pytest.mark.parametrize("recipe", ["cifar10-fast", "cifar10-fast-lookahead", "cifar10-narrow-infobatch", "cifar10-narrow-selective-backprop"])
def test_vision_recipes_run_on_tiny_data(tmp_path, recipe):
    path = _tiny_official_cifar(tmp_path / "cifar")
    r = run_cli("train", recipe, f"data.path={path}", "data.batch_size=16", "data.eval_batch_size=40",
                "model.widths=[8,8,8]", "trainer.max_duration=3ep", "trainer.eval_interval=3ep",
                "algorithms.patch_whitening.num_images=100", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "val/acc=" in r.stdout


def test_imagenet_recipes_smoke_on_a_generated_image_folder(tmp_path):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 4)):
        for c in ("cat", "dog"):
            (tmp_path / "img" / split / c).mkdir(parents=True)
            for i in range(n):
                h, w = rng.integers(40, 72, 2)
                Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / "img" / split / c / f"{i}.jpg")
    for recipe in ("resnet50-imagenet-baseline", "resnet50-imagenet-fast"):
        r = run_cli("train", recipe, f"data.path={tmp_path / 'img'}", "data.image_size=32", "data.eval_resize=36",
                    "data.batch_size=4", "data.eval_batch_size=4", "data.num_workers=0", "model.num_classes=2",
                    "model.width=8", "trainer.max_duration=1ep", "schedule.warmup=1ba", "--no-progress", cwd=tmp_path)
        assert r.returncode == 0, (recipe, r.stderr[-2000:])
        assert "val/acc=" in r.stdout
    r = run_cli("train", "resnet50-imagenet-baseline", f"data.path={tmp_path / 'nothing'}", "--no-progress", cwd=tmp_path)
    assert r.returncode != 0 and "no image folder" in r.stderr
