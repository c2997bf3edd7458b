"""Hostile and careless use, by class (the mechanism behind each, not only the case reported):
a failing tracker never stops training by surprise; text that is not an e-mail is never cut;
labels and tokenizers are part of a run; what a corpus may take is bounded and a signal stops
its preparation; caches are keyed by content; what hasten wrote is validated when read; every
mistake is one line."""
import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

from hasten import Trainer
from hasten.build import build_run
from hasten.callbacks import Profile
from hasten.config import load_recipe
from hasten.data import corpus as corpus_mod
from hasten.data.cifar import read_image_zip
from hasten.data.corpus import BPE, encode_documents, read_documents
from hasten.errors import CheckpointError, ConfigError, DataError
from hasten.loggers import LoggerDestination
from hasten.runs import resume_recipe
from hasten.tasks.text_classification import DataConfig, class_names, is_email, split_labelled, strip_headers

from tiny import image_zip, loader, mlp, run_cli

WORDS = "the quick brown fox jumps over a lazy dog while seven wise owls sing of rivers and stone".split()


# ---------------------------------------------------------------------------- trackers
class Flaky(LoggerDestination):
    """A tracker whose server goes away at its third metrics call."""

    def __init__(self):
        self.calls = 0

    def log_metrics(self, metrics, step):
        self.calls += 1
        if self.calls == 3:
            raise ConnectionError("503 Service Unavailable")


def test_a_failing_tracker_is_switched_off_with_one_warning_and_training_goes_on():
    flaky = Flaky()
    tr = Trainer(mlp(), loader(n=64), max_duration="16ba", log_interval="1ba", loggers=[flaky], eval_interval="1ep")
    with pytest.warns(UserWarning, match=r"Flaky failed logging metrics at step 3 \(ConnectionError: 503"):
        state = tr.fit(summary=False)
    assert state.timestamp.batch == 16 and flaky.calls == 3 and state.stop_reason is None


def test_on_logger_error_stop_ends_the_run_cleanly_with_a_checkpoint(tmp_path):
    tr = Trainer(mlp(), loader(n=64), max_duration="16ba", log_interval="1ba", loggers=[Flaky()],
                 save_folder=str(tmp_path), save_interval="100ba", on_logger_error="stop")
    state = tr.fit(summary=False)
    assert state.stop_reason == "logger" and state.timestamp.batch == 3
    assert state.last_checkpoint and Path(state.last_checkpoint).exists()
    with pytest.raises(ValueError, match="on_logger_error"):
        Trainer(mlp(), loader(), on_logger_error="ignore")


def test_tracker_settings_are_checked_by_key_when_the_recipe_loads(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer\.mlflow.*has experiment: 5, which is not a str"):
        load_recipe("cifar10-baseline", ["trainer.mlflow={experiment: 5}"])
    with pytest.raises(ConfigError, match=r"trainer\.wandb.*has mode 'loud', not one of"):
        load_recipe("cifar10-baseline", ["trainer.wandb={mode: loud}"])
    (tmp_path / "store").mkdir()
    with pytest.raises(ConfigError, match=r"trainer\.mlflow.*is a folder; an sqlite store is a file"):
        load_recipe("cifar10-baseline", [f"trainer.mlflow={{tracking_uri: 'sqlite:///{tmp_path / 'store'}'}}"])
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if not os.access(ro, os.W_OK):   # (root writes anywhere)
            with pytest.raises(ConfigError, match="cannot be written"):
                load_recipe("cifar10-baseline", [f"trainer.mlflow={{tracking_uri: 'sqlite:///{ro / 'm.db'}'}}"])
    finally:
        ro.chmod(0o700)


def test_a_tracker_that_does_not_answer_fails_the_set_up_in_bounded_time(monkeypatch):
    import hasten.build as build_mod
    monkeypatch.setattr(build_mod, "TRACKER_SETUP_S", 0.3)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"trainer\.mlflow: the tracker did not answer within 0 s"):
        build_mod._set_up_tracker("mlflow", lambda: time.sleep(5))
    assert time.perf_counter() - t0 < 2
    with pytest.raises(ConfigError, match=r"trainer\.wandb: could not start the tracker \(PermissionError: read-only"):
        build_mod._set_up_tracker("wandb", lambda: (_ for _ in ()).throw(PermissionError("read-only\nstore")))


# ---------------------------------------------------------------------------- text
@pytest.mark.parametrize("text", ["Review: great film\n\nloved it", "Q: what is it?\n\nA: a fox", "Note: buy milk",
                                  "https://example.com/x is a link\n\nmore", "Subject: hi\nNote: x\n\nbody",
                                  "Title: A\nAuthor: B\n\nchapter one"])
def test_text_that_is_not_recognisably_an_email_is_left_whole(text):
    assert not is_email(text)
    assert strip_headers(text, "subject") == text and strip_headers(text, "drop") == text


def test_an_email_is_recognised_with_continuation_lines():
    mail = "Received: from a\n\tby b\nFrom: x@y\nSubject: hello\n\nthe body"
    assert is_email(mail) and strip_headers(mail, "subject") == "Subject: hello\n\nthe body"


def _docs(labels, folders=None):
    from hasten.data.corpus import Document
    return [Document(f"text {i}", {"label": lab, "id": str(i), "folder": (folders or {}).get(i, "a")})
            for i, lab in enumerate(labels)]


@pytest.mark.parametrize("labels, match", [
    (["spam", "Spam", "ham"], "differ only by case or white space"),
    (["spam", "spam ", "ham"], "differ only by case or white space"),
    ([1, 1.0, 0], "a label is a class name or a whole number"),
    ([1, "1", 0], "more than one kind"),
    (["spam", None, "ham"], "record 2 has label None"),
    ([True, False], "a label is a class name"),
])
def test_labels_are_one_kind_and_never_two_classes_by_spelling(labels, match):
    with pytest.raises(DataError, match=match):
        class_names(_docs(labels), DataConfig(source="x.jsonl"))


def test_a_recorded_class_list_is_used_and_unknown_labels_refused():
    d = DataConfig(source="x.jsonl", classes=["spam", "ham"])
    assert class_names(_docs(["ham", "spam"]), d) == ["spam", "ham"]   # the recorded order, not sorted
    with pytest.raises(DataError, match="'eggs' are not among the classes this run recorded"):
        class_names(_docs(["ham", "eggs"]), d)
    assert class_names(_docs([1, 0, 1]), DataConfig(source="x.jsonl")) == ["0", "1"]


def test_a_validation_folder_no_record_holds_is_refused():
    with pytest.raises(DataError, match=r"data.val_folders names 'hrad', which no record's 'folder' holds"):
        split_labelled(_docs(["a", "b"] * 10, {0: "hard"}), DataConfig(source="x.jsonl", val_folders=["hrad"]))


# ---------------------------------------------------------------------------- tokenizers in a run
def _write_corpus(path, docs=30, extra=""):
    import numpy as np
    rng = np.random.default_rng(0)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i in range(docs):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS, 80)) + "." + extra}) + "\n")


def test_the_tokenizer_is_part_of_the_run_and_a_changed_corpus_is_refused(tmp_path):
    corpus = tmp_path / "c.jsonl.gz"
    _write_corpus(corpus)
    over = ["data.tokenizer=bpe", f"data.source={corpus}", "data.vocab_size=300", "data.block_size=16",
            "data.batch_size=4", "model.n_layer=1", "model.n_head=2", "model.n_embd=16", "trainer.max_duration=2ba",
            "trainer.eval_interval=2ba", f"trainer.run_dir={tmp_path / 'run'}", "trainer.progress_bar=false",
            "trainer.tensorboard=false"]
    recipe = load_recipe("shakespeare-char-baseline", over)
    run = build_run(recipe)
    run.trainer.fit(summary=False)
    run.close()
    recorded = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())["data"]["tokenizer_sha256"]
    assert recorded == run.built.info["tokenizer"].digest and len(recorded) == 64
    _write_corpus(corpus, extra=" zebra quartz jinx")   # the corpus changed under the run
    resumed = resume_recipe(tmp_path / "run", ["trainer.max_duration=4ba"])
    assert resumed.data.tokenizer_sha256 == recorded
    with pytest.raises(DataError, match="not the one this run recorded"):
        build_run(resumed)


def test_a_damaged_token_cache_is_encoded_again(tmp_path, monkeypatch):
    monkeypatch.setenv("HASTEN_DATA", str(tmp_path))
    from hasten.data.corpus import Document, corpus_tokenizer
    docs = [Document(" ".join(WORDS) * 3, {})] * 4
    tok = corpus_tokenizer(docs, 270)
    first = encode_documents(tok, docs, "k")
    cache = next((tmp_path / "tokens").glob("k-*.npz"))
    cache.write_bytes(b"PK\x03\x04 not a zip")
    assert [list(x) for x in encode_documents(tok, docs, "k")] == [list(x) for x in first]


# ---------------------------------------------------------------------------- bounds and signals
def test_what_a_corpus_may_take_is_bounded_with_the_limit_named(tmp_path, monkeypatch):
    monkeypatch.setenv("HASTEN_MAX_DOCUMENT_MB", "1")
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.txt", "x" * (3 << 20))   # 3 MiB that compress to a few KB
    assert bomb.stat().st_size < 50_000
    with pytest.raises(DataError, match=r"member a.txt is larger than the document limit \(1 MiB\); .*"
                                        r"HASTEN_MAX_DOCUMENT_MB"):
        read_documents(str(bomb))
    monkeypatch.setenv("HASTEN_MAX_DOCUMENT_MB", "64")
    monkeypatch.setenv("HASTEN_MAX_LINE_MB", "0.5")
    with pytest.raises(DataError, match=r"a line of .* is larger than the line limit .*HASTEN_MAX_LINE_MB"):
        read_documents(str(bomb))
    lines = tmp_path / "c.jsonl"
    lines.write_text("\n".join(json.dumps({"text": "word " * 1000}) for _ in range(400)))
    monkeypatch.setenv("HASTEN_MAX_CORPUS_MB", "1")
    with pytest.raises(DataError, match="the corpus .* is larger than the corpus limit"):
        read_documents(str(lines))
    monkeypatch.setenv("HASTEN_MAX_CORPUS_MB", "lots")
    with pytest.raises(ConfigError, match="HASTEN_MAX_CORPUS_MB='lots': give a size in MiB"):
        read_documents(str(lines))


def test_sigterm_stops_tokenizer_training_within_two_seconds_and_its_child_with_it(tmp_path):
    script = textwrap.dedent(f"""
        import signal, sys
        from hasten.processes import raise_terminated
        from hasten.data.corpus import train_bpe
        signal.signal(signal.SIGTERM, raise_terminated)
        texts = [" ".join(str(i * j) for j in range(4000)) for i in range(3000)]
        print("training", flush=True)
        train_bpe(texts, 60000)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "training"
    time.sleep(1.5)   # the child is training by now
    children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                               text=True).stdout.split()]
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert time.perf_counter() - t0 < 2.0
    time.sleep(0.2)
    for c in children:
        assert not Path(f"/proc/{c}").exists() or Path(f"/proc/{c}/stat").read_text().split()[2] == "Z"


# ---------------------------------------------------------------------------- caches keyed by content
def test_the_decoded_image_cache_is_keyed_by_content_not_name_size_and_time(tmp_path):
    a, b = tmp_path / "a" / "cifar.zip", tmp_path / "b" / "cifar.zip"
    a.parent.mkdir()
    b.parent.mkdir()
    image_zip(a, seed=0)
    image_zip(b, seed=1)
    assert a.stat().st_size == b.stat().st_size   # PNGs of random pixels: the same size
    os.utime(b, (a.stat().st_atime, a.stat().st_mtime))
    first = read_image_zip(a, cache_dir=tmp_path / "cache")
    second = read_image_zip(b, cache_dir=tmp_path / "cache")
    assert not torch.equal(first.train_x, second.train_x)
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 2


# ---------------------------------------------------------------------------- what hasten wrote, checked when read
def _checkpoint(tmp_path):
    tr = Trainer(mlp(), loader(n=32), max_duration="2ba", save_folder=str(tmp_path / "ck"), save_interval="2ba")
    tr.fit(summary=False)
    return Path(tr.state.last_checkpoint)


@pytest.mark.parametrize("timestamp, match", [({"batch": "forty"}, "field batch is 'forty'"),
                                              ({"get": 5}, "unknown field 'get'"),
                                              ({"batch": -1}, "field batch is -1")])
def test_a_checkpoint_whose_metadata_is_not_hasten_s_is_one_line(tmp_path, timestamp, match):
    path = _checkpoint(tmp_path)
    payload = torch.load(path, weights_only=True)
    meta = json.loads(payload["meta"])
    meta["timestamp"] = timestamp
    payload["meta"] = json.dumps(meta)
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=f"metadata does not fit what hasten writes .*{match}"):
        Trainer(mlp(), loader(n=32), max_duration="4ba", load_path=str(path))


def test_an_artifact_without_a_recipe_or_with_deep_nesting_is_one_line(tmp_path):
    from hasten.compress.artifact import read_artifact, save_artifact
    path = tmp_path / "a.hasten"
    save_artifact(path, {"w": torch.zeros(2)}, {"timestamp": {"batch": 1}})
    with pytest.raises(CheckpointError, match="holds no recipe"):
        read_artifact(path)
    payload = torch.load(path, weights_only=True)
    payload["meta"] = "[" * 100_000
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=r"nested deeper than anything hasten writes .*hasten compress"):
        read_artifact(path)


# ---------------------------------------------------------------------------- one line for each mistake
def test_a_base_chain_that_loops_names_the_loop_in_one_short_line(tmp_path):
    d1 = tmp_path / "d1"
    d1.mkdir()
    (d1 / "loop.yaml").write_text("base: ../d1/loop.yaml\n")
    with pytest.raises(ConfigError) as e:
        load_recipe(str(d1 / "loop.yaml"))
    assert "loops back to" in str(e.value) and len(str(e.value)) < 600


def test_hasten_data_pointing_at_a_file_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("x")
    monkeypatch.setenv("HASTEN_DATA", str(tmp_path / "f"))
    with pytest.raises(ConfigError, match="HASTEN_DATA=.* is a file, not a folder"):
        corpus_mod.data_root()


def test_a_profile_longer_than_the_run_says_so():
    tr = Trainer(mlp(), loader(n=24), max_duration="3ba", callbacks=[Profile(steps=10, print_table=False)])
    with pytest.warns(UserWarning, match="nothing was profiled"):
        tr.fit(summary=False)


def test_a_module_that_exits_on_import_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "exiting_model.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from hasten.usercode import load
    with pytest.raises(ConfigError, match=r"model.name: importing 'exiting_model' .* called sys.exit\(3\)"):
        load("exiting_model:Net", "model.name")


def test_a_factory_dataset_without_targets_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "no_targets.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import Dataset
        class Images(Dataset):
            def __len__(self): return 8
            def __getitem__(self, i): return torch.zeros(3, 8, 8)
        def make(): return Images(), None
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    from hasten.tasks.base import user_loaders
    with pytest.raises(ConfigError, match=r"train dataset gives a Tensor as an item; each item must be an \(inputs, "):
        user_loaders("no_targets:make", {}, 4, 4, 0)


def test_cli_exit_code_and_line_for_a_loop(tmp_path):
    (tmp_path / "loop.yaml").write_text("base: loop.yaml\n")
    r = run_cli("train", str(tmp_path / "loop.yaml"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "loops back to" in r.stderr


# ---------------------------------------------------------------------------- downloads
def _serve(folder: Path):
    """An HTTP server on the loopback address serving `folder` (query strings ignored, as an
    object store's signed URLs are to the path they name)."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_url_with_a_query_string_keeps_its_file_type_from_the_path(tmp_path, monkeypatch):
    import hashlib
    monkeypatch.setenv("HASTEN_DATA", str(tmp_path / "data"))
    (tmp_path / "site").mkdir()
    lines = [json.dumps({"text": f"document number {i} of the signed corpus."}) for i in range(5)]
    body = ("\n".join(lines) + "\n").encode()
    (tmp_path / "site" / "docs.jsonl").write_bytes(body)
    server = _serve(tmp_path / "site")
    try:
        url = (f"http://127.0.0.1:{server.server_port}/docs.jsonl?X-Amz-Signature=abc123&X-Amz-Expires=60"
               f"#sha256={hashlib.sha256(body).hexdigest()}")
        path = corpus_mod.resolve_source(url)
        assert path.name == "docs.jsonl"
        assert len(read_documents(url)) == 5   # read as JSON lines: five documents, not one of plain text
        from hasten.data.streaming import is_stream
        assert not is_stream(url)              # a file with its checksum, not a prepared source at that URL
    finally:
        server.shutdown()


def test_a_download_whose_checksum_is_wrong_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("HASTEN_DATA", str(tmp_path / "data"))
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "a document"}) + "\n")
    wrong = "0" * 64
    with pytest.raises(DataError, match="sha256"):
        corpus_mod.resolve_source(f"file://{tmp_path / 'c.jsonl'}#sha256={wrong}")
    assert not (tmp_path / "data").exists()   # no folder named by the wrong checksum, no temporary


# ---------------------------------------------------------------------------- weights from elsewhere
def _hf_gpt2_args(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": "the owls sing of rivers and stone " * 12}) + "\n" for _ in range(30)))
    return ["train", "prose-gpt-baseline", f"data.source={corpus}", "data.vocab_size=300", "data.block_size=16",
            "model={name: hf/gpt2, n_layer: 1, n_embd: 32, n_head: 2, n_positions: 32}", "data.batch_size=8",
            "trainer.max_duration=1ba", "trainer.eval_interval=1ba", "schedule.warmup=1ba", "trainer.precision=fp32",
            "--no-progress"]


def _one_error(r) -> str:
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("hasten: error:")]
    assert r.returncode != 0 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-1500:]
    return errors[0]


def test_weights_of_another_architecture_are_refused_and_a_partial_load_is_taken_only_when_asked(tmp_path):
    transformers = pytest.importorskip("transformers")
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=64))
    bert.save_pretrained(tmp_path / "bert")
    r = subprocess.run([sys.executable, "-m", "hasten.cli", *_hf_gpt2_args(tmp_path),
                        f"trainer.load_path={tmp_path / 'bert'}", f"trainer.run_dir={tmp_path / 'r1'}"],
                       capture_output=True, text=True, timeout=300)
    line = _one_error(r)
    assert "0 of this model's" in line and "tensors fit it by name and shape" in line
    # a GPT-2 of another width: only the position-free layer norms fit, a small share of the model
    gpt = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=300, n_layer=1, n_embd=32, n_head=2,
                                                               n_positions=32))
    sd = gpt.state_dict()
    keep = {k: v for k, v in sd.items() if ".ln_" in k}
    n_keep = len(keep)   # (save_pretrained empties the mapping it is given)
    gpt.save_pretrained(tmp_path / "part", state_dict=keep)
    r = subprocess.run([sys.executable, "-m", "hasten.cli", *_hf_gpt2_args(tmp_path),
                        f"trainer.load_path={tmp_path / 'part'}", f"trainer.run_dir={tmp_path / 'r2'}"],
                       capture_output=True, text=True, timeout=300)
    line = _one_error(r)
    assert f"{n_keep} of this model's" in line and "trainer.load_min_share=" in line
    r = run_cli(*_hf_gpt2_args(tmp_path), f"trainer.load_path={tmp_path / 'part'}", "trainer.load_min_share=0",
                f"trainer.run_dir={tmp_path / 'r3'}")
    assert r.returncode == 0, r.stderr[-1500:]


def test_damaged_or_refused_weight_files_of_other_libraries_get_hasten_s_line(tmp_path):
    transformers = pytest.importorskip("transformers")
    gpt = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=300, n_layer=1, n_embd=32, n_head=2,
                                                               n_positions=32))
    gpt.save_pretrained(tmp_path / "trunc")
    st = next((tmp_path / "trunc").glob("*.safetensors"))
    st.write_bytes(st.read_bytes()[:7])
    r = subprocess.run([sys.executable, "-m", "hasten.cli", *_hf_gpt2_args(tmp_path),
                        f"trainer.load_path={tmp_path / 'trunc'}", f"trainer.run_dir={tmp_path / 'r1'}"],
                       capture_output=True, text=True, timeout=300)
    line = _one_error(r)
    assert st.name in line and "not a safetensors file that can be read" in line
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "config.json").write_text((tmp_path / "trunc" / "config.json").read_text())
    torch.save({"weights": Path("x")}, tmp_path / "pickled" / "pytorch_model.bin")   # not tensors: refused unread
    r = subprocess.run([sys.executable, "-m", "hasten.cli", *_hf_gpt2_args(tmp_path),
                        f"trainer.load_path={tmp_path / 'pickled'}", f"trainer.run_dir={tmp_path / 'r2'}"],
                       capture_output=True, text=True, timeout=300)
    line = _one_error(r)
    assert "pytorch_model.bin holds objects other than tensors" in line
    assert "weights_only=False" not in line and "weights_only" not in line and len(line) < 400


# ---------------------------------------------------------------------------- a run still writing
def test_the_newest_checkpoint_of_a_live_run_is_read_even_when_it_vanishes_under_the_reader(tmp_path, monkeypatch):
    from hasten.checkpoint import CheckpointIO, saving
    folder = tmp_path / "ck"
    folder.mkdir()
    for b in (2, 4, 6):
        torch.save({"b": b}, folder / f"ep0-ba{b}.pt")
    loads = []

    class Racing(CheckpointIO):
        def load(self, path):
            loads.append(Path(path).name)
            if Path(path).name == "ep0-ba6.pt":   # the run removes it (keep_last) between the listing and the read
                Path(path).unlink()
                raise FileNotFoundError(f"no checkpoint at {path}")
            return {"path": Path(path).name}

    path, payload = saving.load_latest(folder, Racing())
    assert path.name == "ep0-ba4.pt" and payload == {"path": "ep0-ba4.pt"} and loads == ["ep0-ba6.pt", "ep0-ba4.pt"]

    class Always(CheckpointIO):   # every checkpoint replaced before it can be read: say so in one line
        def load(self, path):
            Path(path).unlink()
            torch.save({}, Path(path).with_name(f"ep0-ba{int(Path(path).stem.split('ba')[1]) + 100}.pt"))
            raise FileNotFoundError(path)

    with pytest.raises(CheckpointError, match="still writing"):
        saving.load_latest(folder, Always())


def test_a_memory_limit_nothing_fits_in_says_what_it_allows_and_what_was_needed(tmp_path):
    from hasten.microbatch import ActivationLimitError
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    for microbatch in (None, "auto"):
        t = Trainer(mlp(), data, max_duration="2ba", memory_limit=64, microbatch=microbatch, device="cpu")
        with pytest.raises(ActivationLimitError) as e:
            t.fit(summary=False)
        msg = str(e.value)
        assert "allows 64 bytes" in msg and "\n" not in msg
        if microbatch == "auto":
            assert "a micro-batch of 1 sample even saved more" in msg and "raise trainer.memory_limit to more than" in msg
        else:
            assert "a micro-batch of 16 samples saved more" in msg and "trainer.microbatch=auto" in msg
        assert isinstance(e.value, torch.OutOfMemoryError)   # still out of memory to code that handles that
