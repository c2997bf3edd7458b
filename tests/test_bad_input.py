"""Bad input gets hasten's own one-line error, naming the problem and the fix: never a
traceback. Unwritable folders and a full disk are injected (CI runs as root, where file
modes do not block writes)."""
import errno
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from hasten import Trainer
from hasten.algorithms import LabelSmoothing
from hasten.callbacks import EarlyStopping
from hasten.cli import main
from hasten.data.cifar import read_image_zip
from hasten.errors import DataError, TrainingError

from tiny import loader, mlp

TINY = Path(__file__).parent / "helpers" / "tiny_lm.yaml"
QUICK = ["trainer.max_duration=4ba", "trainer.eval_interval=4ba", "--no-progress"]


def _one_line_error(capsys, code, expected_code, *needles):
    err = capsys.readouterr().err.strip()
    assert code == expected_code, err
    assert len(err.splitlines()) == 1 and err.startswith("hasten: error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, (n, err)
    return err


@pytest.mark.parametrize("override, needles", [
    ("optimizer.lr=-1", ["optimizer.lr", ">= 0"]),
    ("trainer.grad_accum=0", ["trainer.grad_accum", ">= 1"]),
    ("data.batch_size=0", ["data.batch_size", ">= 1"]),
    ("trainer.device=gpu", ["trainer.device", "not a device"]),
    ("model.dropout=1.5", ["model.dropout", "< 1"]),
    ("optimizer.adam.betas=[0.9,1.5]", ["optimizer.adam.betas"]),
    ("trainer.eval_interval=ten", ["trainer.eval_interval", "cannot read"]),
    ("algorithms.ema.decay=2", ["algorithms.ema", "decay"]),
    ("trainer.compile_mode=fast", ["trainer.compile_mode", "reduce-overhead"]),
    ("trainer.compile_mode=reduce-overhead", ["trainer.compile_mode", "trainer.compile=true"]),
    ("trainer.precision=fp8-mixed", ["trainer.precision", "algorithms.float8_training={}"]),
])
def test_out_of_range_settings_are_one_line_errors_before_anything_is_built(tmp_path, capsys, override, needles):
    code = main(["train", str(TINY), f"trainer.run_dir={tmp_path / 'run'}"] + QUICK + [override])
    _one_line_error(capsys, code, 2, *needles)
    assert not (tmp_path / "run").exists()


def test_a_bad_base_and_a_relative_base(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: 5\n")
    _one_line_error(capsys, main(["train", str(bad), "--print-config"]), 2, "base: 5")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "parent.yaml").write_text(TINY.read_text().replace("base: shakespeare-char-baseline",
                                                                           "base: shakespeare-char-baseline\n"
                                                                           "description: parent"))
    child = tmp_path / "sub" / "child.yaml"
    child.write_text("base: parent.yaml\noptimizer: {lr: 0.005}\n")
    assert main(["train", str(child), "--print-config"]) == 0   # resolved beside child.yaml, not in the cwd
    assert "lr: 0.005" in capsys.readouterr().out


@pytest.mark.parametrize("content, needle", [(b"", "is empty"), (b"ab", "too few"), (b"\xff\xfe\x00x" * 50, "not UTF-8")])
def test_bad_text_files(tmp_path, capsys, content, needle):
    f = tmp_path / "text.txt"
    f.write_bytes(content)
    code = main(["train", str(TINY), f"data.source={f}", f"trainer.run_dir={tmp_path / 'run'}"] + QUICK)
    _one_line_error(capsys, code, 1, needle)
    assert not (tmp_path / "run").exists()   # a run that never started leaves no folder


def test_autoresume_without_a_run_folder_says_so(capsys):
    _one_line_error(capsys, main(["train", str(TINY), "trainer.autoresume=true"] + QUICK), 2, "trainer.run_dir")


def test_an_unwritable_run_folder_is_found_before_training(tmp_path, capsys, monkeypatch):
    import hasten.files as files

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(files.tempfile, "mkstemp", denied)
    code = main(["train", str(TINY), f"trainer.run_dir={tmp_path / 'run'}"] + QUICK)
    _one_line_error(capsys, code, 1, "no permission", "run folder")


def test_an_unwritable_checkpoint_folder_is_found_at_fit_start(tmp_path, monkeypatch):
    import hasten.files as files
    from hasten.errors import RunFolderError
    steps = []
    tr = Trainer(mlp(), loader(), max_duration="4ba", device="cpu", save_folder=str(tmp_path / "ck"))
    monkeypatch.setattr(files.tempfile, "mkstemp", lambda *a, **k: (_ for _ in ()).throw(
        PermissionError(errno.EACCES, "Permission denied")))
    monkeypatch.setattr(tr.state.model, "forward", lambda x: steps.append(1))
    with pytest.raises(RunFolderError, match="no permission .*checkpoint folder"):
        tr.fit()
    assert steps == []   # no training time was spent


def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    import hasten.build as build
    monkeypatch.setattr(build, "build_algorithms", lambda r: (_ for _ in ()).throw(KeyError("boom")))
    err = _one_line_error(capsys, main(["train", str(TINY), f"trainer.run_dir={tmp_path / 'r'}"] + QUICK), 1)
    assert "--debug" in err
    with pytest.raises(KeyError):
        main(["--debug", "train", str(TINY), f"trainer.run_dir={tmp_path / 'r2'}"] + QUICK)


# ---------------------------------------------------------------------------- the loss
@pytest.mark.parametrize("loss_fn, needle", [
    (lambda o, t: {"loss": o.sum()}, "returned a dict"),
    (lambda o, t: 1.0, "returned a float"),
    (lambda o, t: torch.nn.functional.cross_entropy(o, t[:3]), "failed on the model's outputs"),
])
def test_a_loss_that_returns_no_tensor_or_does_not_fit(loss_fn, needle):
    for evaluate in (False, True):
        tr = Trainer(mlp(), loader(), loss_fn=loss_fn, max_duration="2ba", device="cpu", eval_dataloader=loader())
        with pytest.raises(TrainingError, match=needle):
            tr.evaluate() if evaluate else tr.fit()


def test_outputs_that_do_not_fit_the_default_loss():
    with pytest.raises(TrainingError, match=r"outputs \(a tensor of shape \(8, 3\).*targets"):
        Trainer(mlp(d_out=3), loader(), max_duration="2ba", device="cpu").fit()


@pytest.mark.parametrize("kw, needle", [
    (dict(algorithms="ema"), r"algorithms='ema' is a str; give a list of instances"),
    (dict(algorithms=["ema"]), r"algorithms: 'ema' \(str\) is not a hasten Algorithm"),
    (dict(algorithms=[LabelSmoothing]), r"LabelSmoothing is a class: give an instance"),
    (dict(callbacks=[EarlyStopping]), r"EarlyStopping is a class: give an instance"),
    (dict(callbacks=3), r"callbacks=3 is a int"),
    (dict(loggers=[object()]), r"is not a logger"),
    (dict(optimizers=5), r"optimizers: 5 \(int\) is not an optimizer"),
    (dict(optimizers=lambda m: None), r"\(what the factory returned\) is not an optimizer"),
    (dict(schedulers="cosine"), r"schedulers: 'cosine' \(str\) is not a schedule"),
    (dict(loss_fn="ce"), r"loss_fn='ce' is not a function"),
    (dict(metrics=["acc"]), r"metrics=\['acc'\]: give a dict"),
    (dict(metrics={"acc": "accuracy"}), r"metrics\['acc'\]: 'accuracy' \(str\) is not a metric"),
    (dict(compile="yes"), r"compile='yes': give True, False, or a dict"),
    (dict(eval_dataloader=torch.zeros(4, 2)), r"eval_dataloader: a Tensor is not a source of batches"),
])
def test_what_is_not_an_algorithm_callback_logger_or_optimizer_is_named_before_training(kw, needle):
    """Before, each of these was an AttributeError from deep inside the first event or step."""
    with pytest.raises(TypeError, match=needle):
        Trainer(mlp(), loader(), max_duration="2ba", device="cpu", **kw)


def test_a_negative_clipping_norm_is_refused_as_a_keyword_and_as_an_algorithm():
    with pytest.raises(ValueError, match=r"grad_clip_norm=-1.0: give the largest gradient norm"):
        Trainer(mlp(), loader(), max_duration="2ba", device="cpu", grad_clip_norm=-1.0)
    from hasten.algorithms import GradientClipping
    with pytest.raises(ValueError, match="threshold must be > 0"):
        GradientClipping("norm", 0.0)


def test_predict_and_evaluate_name_a_tensor_given_for_batches():
    tr = Trainer(mlp(), loader(), max_duration="2ba", device="cpu")
    for call in (tr.predict, tr.evaluate):
        with pytest.raises(TypeError, match="a Tensor is not a source of batches"):
            call(torch.zeros(4, 2))


def test_early_stopping_on_a_metric_evaluation_does_not_produce_says_which_it_does():
    from hasten.errors import ConfigError
    tr = Trainer(mlp(), loader(), eval_dataloader=loader(), max_duration="2ba", eval_interval="1ba", device="cpu",
                 callbacks=[EarlyStopping(monitor="val/acc", mode="max")])
    with pytest.raises(ConfigError, match=r"monitors 'val/acc', but evaluation produced \['val/loss'\]: give monitor="):
        tr.fit(summary=False)


def test_one_algorithm_or_callback_alone_is_taken_as_a_list():
    stop = EarlyStopping(monitor="val/loss", patience=3)
    tr = Trainer(mlp(), loader(), max_duration="2ba", device="cpu", algorithms=LabelSmoothing(0.1), callbacks=stop)
    assert [type(a) for a in tr.state.algorithms] == [LabelSmoothing] and stop in tr.state.callbacks
    tr.fit()
    assert tr.state.timestamp.batch == 2


# ---------------------------------------------------------------------------- image archives
def _png(color):
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), color).save(buf, format="PNG")
    return buf.getvalue()


def _zip(path, broken_member: bytes | None = None):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for split in ("train", "test"):
            for i, cls in enumerate(("airplane", "automobile")):
                data = broken_member if (broken_member is not None and split == "test" and i == 1) else _png((i * 90, 0, 0))
                zf.writestr(f"{split}/{cls}/{i:05d}.png", data)
    return path


def test_a_truncated_zip(tmp_path):
    z = _zip(tmp_path / "d.zip")
    z.write_bytes(z.read_bytes()[:200])
    with pytest.raises(DataError, match="not a readable zip"):
        read_image_zip(z, cache_dir=tmp_path / "cache")


def test_a_zip_member_with_a_bad_crc(tmp_path):
    z = _zip(tmp_path / "d.zip")
    data = bytearray(z.read_bytes())
    at = data.find(b"IDAT") + 8   # flip a byte inside the first image's pixels
    data[at] ^= 0xFF
    z.write_bytes(bytes(data))
    with pytest.raises(DataError, match="is damaged"):
        read_image_zip(z, cache_dir=tmp_path / "cache")


def test_an_undecodable_image(tmp_path):
    z = _zip(tmp_path / "d.zip", broken_member=b"this is no image")
    with pytest.raises(DataError, match="test/automobile/00001.png is not an image"):
        read_image_zip(z, cache_dir=tmp_path / "cache")


def test_a_damaged_cache_is_rebuilt(tmp_path):
    z = _zip(tmp_path / "d.zip")
    first = read_image_zip(z, cache_dir=tmp_path / "cache")
    (cache,) = (tmp_path / "cache").glob("*.npz")
    cache.write_bytes(cache.read_bytes()[:100])
    with pytest.warns(UserWarning, match="damaged"):
        again = read_image_zip(z, cache_dir=tmp_path / "cache")
    assert torch.equal(first.train_x, again.train_x)
    with np.load(cache) as ok:   # rewritten whole
        assert ok["train_x"].shape == tuple(first.train_x.shape)


@pytest.mark.parametrize("args, needles", [
    (["--budget", "ten"], ["--budget ten", "e.g. 10m"]),
    (["--min-gain", "150%"], ["--min-gain 150%", "5%"]),
    (["--min-gain", "lots"], ["--min-gain lots", "0.05"]),
    (["--budget", "-5m"], ["--budget -5m", "e.g. 10m"]),      # a negative value is the option's, not a flag
    (["--min-gain", "-5%"], ["--min-gain -5%", "5%"]),
])
def test_tune_options_out_of_range_get_one_line(capsys, args, needles):
    _one_line_error(capsys, main(["tune", str(TINY), *args]), 2, *needles)


@pytest.mark.parametrize("command, named", [("tune", "RECIPE"), ("eval", "ARTIFACT"), ("compress", "RUN_OR_CHECKPOINT")])
def test_a_missing_argument_names_only_what_is_required(capsys, command, named):
    # overrides are optional: the usage error must not list KEY=VALUE as required
    with pytest.raises(SystemExit) as e:
        main([command])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and err.endswith(f"the following arguments are required: {named}"), err


@pytest.mark.parametrize("args, needles", [
    (["--eval-every", "-5sp"], ["--eval-every", "-5sp", "cannot read"]),
    (["--cap", "-5"], ["--cap -5.0", "positive"]),
])
def test_a_negative_bench_quantity_gets_the_options_own_one_line_error(capsys, args, needles):
    _one_line_error(capsys, main(["bench", str(TINY), *args]), 2, *needles)


@pytest.mark.parametrize("overrides, needles", [
    (["data.loader=dataloader", "data.brightness=0.1"], ["data.brightness needs data.loader=device"]),
    (["data.loader=dataloader", "data.contrast=0.1", "data.cutout=4"], ["data.cutout, data.contrast need data.loader=device"]),
    (["data.contrast=1"], ["data.contrast", "< 1"]),
    (["data.brightness=-0.5"], ["data.brightness", ">= 0"]),
])
def test_brightness_and_contrast_out_of_range_or_without_the_device_loader(tmp_path, capsys, cifar_zip, overrides, needles):
    code = main(["train", "cifar10-fast", f"data.path={cifar_zip}", f"trainer.run_dir={tmp_path / 'run'}",
                 "--no-progress", "data.alternate_flip=false", "data.channels_last=false"] + overrides)
    _one_line_error(capsys, code, 2, *needles)


def test_an_image_folder_refuses_the_device_loaders_keys_instead_of_ignoring_them(tmp_path, capsys):
    code = main(["train", "resnet50-imagenet-baseline", f"data.path={tmp_path}", "data.brightness=0.1", "data.cutout=8",
                 f"trainer.run_dir={tmp_path / 'run'}", "--no-progress"])
    _one_line_error(capsys, code, 2, "data.cutout, data.brightness: only hasten's device loader", "remove data.cutout, data.brightness")


def test_eval_of_a_missing_artifact_is_one_line_before_anything_is_announced(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "absent.pt")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hasten: error: no artifact at") and "hasten compress" in err
    assert "evaluating" not in err and len(err.strip().splitlines()) == 1
