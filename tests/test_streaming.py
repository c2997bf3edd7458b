"""Data beyond one machine: prepared sources streamed from a folder or an S3-compatible object
store (moto's server on the loopback address), shard-local order, exact mid-epoch resume (one
and two processes, two loader workers), loaders that keep their own state, the share of time a
step waits for data, and nothing on hasten's path importing torchvision."""
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from hasten import Trainer
from hasten.data.prepare import prepare
from hasten.data.resumable import shard_local_order
from hasten.data.streaming import MANIFEST, StreamSplit, read_manifest
from hasten.errors import ConfigError, DataError

from tiny import image_zip, run_cli

WORDS = "the quick brown fox jumps over a lazy dog while seven wise owls sing of rivers and stone".split()
TINY_GPT = ["model.n_layer=1", "model.n_head=2", "model.n_embd=16", "data.block_size=16", "data.batch_size=4",
            "data.eval_batch_size=8", "data.eval_tokens=256", "trainer.eval_interval=8ba", "trainer.precision=fp32",
            "trainer.tensorboard=false", "--no-progress"]


def _corpus(path: Path, docs: int = 40) -> Path:
    rng = np.random.default_rng(0)
    with gzip.open(path, "wt") as f:
        for i in range(docs):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS, 90)) + "."}) + "\n")
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A tiny token source, prepared once: windows of 16 tokens in many small shards."""
    root = tmp_path_factory.mktemp("stream")
    before = os.environ.get("HASTEN_DATA")
    os.environ["HASTEN_DATA"] = str(root / "data")   # the tokenizer's cache: the tests' own
    try:
        manifest, wrote = prepare(str(_corpus(root / "c.jsonl.gz")), str(root / "src"), block_size=16, vocab_size=300,
                                  shard_mb=0.004)
    finally:
        if before is None:
            os.environ.pop("HASTEN_DATA")
        else:
            os.environ["HASTEN_DATA"] = before
    assert wrote and len(manifest["splits"]["train"]["shards"]) > 4
    return root / "src"


def test_shard_local_order_is_a_permutation_drawn_from_seed_and_epoch_alone():
    blocks = [5, 7, 3, 9, 4, 6]
    a, b = shard_local_order(blocks, 0, 0), shard_local_order(blocks, 0, 0)
    assert torch.equal(a, b) and sorted(a.tolist()) == list(range(sum(blocks)))
    assert not torch.equal(a, shard_local_order(blocks, 0, 1)) and not torch.equal(a, shard_local_order(blocks, 1, 0))
    starts = np.cumsum([0] + blocks)
    shard_of = lambda i: int(np.searchsorted(starts, i, side="right") - 1)   # noqa: E731
    first = {shard_of(i) for i in a[:sum(sorted(blocks)[:4])].tolist()}   # rows every window of 4 shards holds
    assert len(first) <= 4   # the first rows come from one window of 4 shards: reads stay local


def test_an_epoch_in_the_shuffled_order_decodes_each_shard_once(prepared, monkeypatch):
    """Rows are shuffled within windows of shards; the reader keeps a window decoded, so reading
    an epoch in that order decodes every shard once, not once per row."""
    import pyarrow.parquet as pq
    split = StreamSplit(str(prepared), "train")
    reads = []
    real = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda path, **k: reads.append(path) or real(path, **k))
    for i in shard_local_order(split.blocks, 0, 1).tolist():
        split.row(i)
    assert len(split.blocks) > 4 and len(reads) == len(split.blocks), (len(reads), len(split.blocks))


def test_prepare_writes_a_manifest_refuses_a_foreign_folder_and_is_idempotent(prepared, tmp_path):
    m = read_manifest(str(prepared))
    assert m["kind"] == "tokens" and m["block_size"] == 16 and (prepared / "tokenizer.json").is_file()
    split = StreamSplit(str(prepared), "train")
    row = split.row(len(split) - 1)
    assert len(row["tokens"]) == 17 and len(row["segments"]) == 16
    again, wrote = prepare(m["settings"]["source"], str(prepared), block_size=16, vocab_size=300, shard_mb=0.004)
    assert not wrote and again["digest"] == m["digest"]
    with pytest.raises(ConfigError, match="prepared with other settings .*block_size: 16 -> 32"):
        prepare(m["settings"]["source"], str(prepared), block_size=32, vocab_size=300, shard_mb=0.004)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty and holds no source hasten prepared .*notes.txt"):
        prepare(m["settings"]["source"], str(tmp_path / "mine"), block_size=16)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"


def _weights(run: Path) -> dict:
    ckpt = max((run / "checkpoints").glob("ep*-ba*.pt"), key=lambda p: int(p.stem.split("ba")[1]))
    return torch.load(ckpt, weights_only=True)["model"]


def _straight_and_resumed(tmp_path, source: str, extra=(), nproc: int = 0):
    """A run of 8 steps with a checkpoint at 4; a copy stopped at 4 and resumed to 8."""
    common = ["train", "prose-gpt-baseline", f"data.source={source}", "trainer.max_duration=8ba",
              "trainer.save_interval=4ba", "trainer.keep_last=2", *TINY_GPT, *extra]
    launch = (lambda *a: subprocess.run([sys.executable, "-m", "hasten.cli", *a, "--nproc", str(nproc)],
                                        capture_output=True, text=True, timeout=300)) if nproc else run_cli
    r = launch(*common, f"trainer.run_dir={tmp_path / 'straight'}")
    assert r.returncode == 0, r.stderr[-2000:]
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    for p in (tmp_path / "resumed" / "checkpoints").glob("ep*-ba8.pt"):
        p.unlink()
    r = launch("train", "--resume", str(tmp_path / "resumed"), "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming at batch 4" in r.stdout, r.stdout[-500:]
    return _weights(tmp_path / "straight"), _weights(tmp_path / "resumed")


def test_a_streamed_run_resumed_mid_epoch_ends_bitwise_as_the_uninterrupted_one(prepared, tmp_path):
    straight, resumed = _straight_and_resumed(tmp_path, str(prepared), ["data.num_workers=2"])
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_two_processes_resume_a_streamed_run_bitwise(prepared, tmp_path):
    straight, resumed = _straight_and_resumed(tmp_path, str(prepared), ["data.num_workers=2"], nproc=2)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


@pytest.fixture(scope="module")
def s3():
    """An S3-compatible server (moto) on the loopback address, and its bucket."""
    import boto3
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server._server.server_port}"
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="data")
    yield endpoint
    server.stop()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_a_source_prepared_to_s3_trains_resumes_and_its_cache_stays_bounded(s3, prepared, tmp_path):
    source = json.loads((prepared / MANIFEST).read_text())["settings"]["source"]
    m, wrote = prepare(source, "s3://data/prose", block_size=16, vocab_size=300, shard_mb=0.004)
    assert wrote and m["digest"] == read_manifest(str(prepared))["digest"]   # the same bytes, wherever they are
    cache = tmp_path / "cache"
    straight, resumed = _straight_and_resumed(tmp_path, "s3://data/prose", [f"data.stream_cache={cache}",
                                                                             "data.stream_cache_limit=40KB"])
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    shards = [p for p in cache.rglob("*.parquet")]
    assert shards and sum(p.stat().st_size for p in shards) <= 40 * 1024
    (tmp_path / "local").mkdir()
    local = _straight_and_resumed(tmp_path / "local", str(prepared))[0]
    assert all(torch.equal(local[k], straight[k]) for k in local)   # streamed from S3 = read locally


def test_a_shard_changed_in_the_store_is_refused(s3, prepared, tmp_path):
    import boto3
    source = json.loads((prepared / MANIFEST).read_text())["settings"]["source"]
    prepare(source, "s3://data/tampered", block_size=16, vocab_size=300, shard_mb=0.004)
    m = read_manifest("s3://data/tampered")
    name = m["splits"]["train"]["shards"][0]["name"]
    boto3.client("s3", endpoint_url=s3).put_object(Bucket="data", Key=f"tampered/{name}", Body=b"not parquet")
    split = StreamSplit("s3://data/tampered", "train", cache_dir=str(tmp_path / "c"))
    with pytest.raises(DataError, match="SHA-256 .*the shard changed in the store since it was prepared"):
        split.row(0)


def _zip_images(path) -> list[np.ndarray]:
    """The training images of an image zip, decoded here with Pillow: the reference."""
    import io
    import zipfile

    from PIL import Image
    with zipfile.ZipFile(path) as z:
        return [np.asarray(Image.open(io.BytesIO(z.read(n))).convert("RGB"))
                for n in sorted(z.namelist()) if n.startswith("train/") and n.endswith(".png")]


def test_images_are_prepared_raw_and_stream_with_the_hosts_augmentation(tmp_path):
    """The streamed rows are the zip's images byte for byte (decoded independently with Pillow);
    training batches are those images normalised, padded by 4 (zeros), cropped at some offset and
    perhaps flipped (each recomputed here with plain tensor ops, every crop and flip tried), not all
    left as they were; evaluation batches are the images normalised only."""
    from hasten.build import build_run
    from hasten.config import load_recipe
    from hasten.data.cifar import MEAN, STD
    from hasten.data.resumable import resumable_sampler
    z = image_zip(tmp_path / "img.zip", train=40, test=20)
    m, _ = prepare(str(z), str(tmp_path / "imgs"), shard_mb=0.01)
    assert m["kind"] == "images" and m["image_shape"] == [32, 32, 3] and len(m["classes"]) == 10
    split = StreamSplit(str(tmp_path / "imgs"), "train")
    reference = {im.tobytes() for im in _zip_images(z)}
    rows = [split.row(i) for i in range(len(split))]
    assert len(rows) == 40 and {bytes(r["image"]) for r in rows} == reference
    recipe = load_recipe("cifar10-baseline", [f"data.stream={tmp_path / 'imgs'}", "data.batch_size=8",
                                              "data.eval_batch_size=20", "data.num_workers=0",
                                              f"trainer.run_dir={tmp_path / 'run'}", "trainer.progress_bar=false",
                                              "trainer.tensorboard=false"])
    run = build_run(recipe)
    try:
        loader = run.trainer.state.train_dataloader
        sampler, _ = resumable_sampler(loader)
        sampler.set_epoch(0)
        order = list(sampler.order(0))[:8]
        x, y = next(iter(loader))
        mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
        moved = 0
        for k, i in enumerate(order):
            raw = np.frombuffer(rows[int(i)]["image"], dtype=np.uint8).reshape(32, 32, 3)
            base = (torch.from_numpy(raw.copy()).permute(2, 0, 1).float() - mean) / std
            padded = torch.zeros(3, 40, 40)
            padded[:, 4:36, 4:36] = base
            found = [(dy, dx, f) for dy in range(9) for dx in range(9) for f in (False, True)
                     if torch.allclose(x[k], (lambda c: c.flip(-1) if f else c)(padded[:, dy:dy + 32, dx:dx + 32]),
                                       atol=1e-5)]
            assert found, f"sample {k} is no crop or flip of its image"
            assert int(y[k]) == int(rows[int(i)]["label"])
            moved += (4, 4, False) not in found
        assert moved >= 4   # augmented: most samples moved or flipped
        xe, _ = next(iter(run.trainer.eval_dataloader))
        eval_split = StreamSplit(str(tmp_path / "imgs"), "eval")
        first = np.frombuffer(eval_split.row(0)["image"], dtype=np.uint8).reshape(32, 32, 3)
        assert torch.allclose(xe[0], (torch.from_numpy(first.copy()).permute(2, 0, 1).float() - mean) / std, atol=1e-5)
    finally:
        run.close()


# ---------------------------------------------------------------------------- loaders that keep state
class Numbers(torch.utils.data.Dataset):
    fetched = []   # the samples read in this process (loaders without workers)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        Numbers.fetched.append(i)
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), i % 4


def _stateful_run(save, duration: str, resume: bool = False, workers: int = 2):
    from torchdata.stateful_dataloader import StatefulDataLoader
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    loader = StatefulDataLoader(Numbers(), batch_size=8, shuffle=True, num_workers=workers)
    tr = Trainer(model, loader, max_duration=duration, save_folder=str(save), save_interval="6ba", autoresume=resume,
                 optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
    tr.fit(summary=False)
    return tr


def test_a_loader_that_keeps_state_is_saved_and_restored_exactly(tmp_path):
    straight = _stateful_run(tmp_path / "a", "11ba")
    _stateful_run(tmp_path / "b", "11ba")
    for p in (tmp_path / "b").glob("ep*"):
        if p.name not in ("ep0-ba6.pt",):
            p.unlink()
    payload = torch.load(tmp_path / "b" / "ep0-ba6.pt", weights_only=True)
    assert payload["loaders"]["train"] and payload["loaders"]["train"][0]   # one rank's state, saved as plain data
    resumed = _stateful_run(tmp_path / "b", "11ba", resume=True)
    for a, b in zip(straight.state.model.parameters(), resumed.state.model.parameters()):
        assert torch.equal(a, b)
    # restored, not replayed: without workers, the resumed run reads only the batches after the checkpoint
    _stateful_run(tmp_path / "c", "6ba", workers=0)
    Numbers.fetched.clear()
    _stateful_run(tmp_path / "c", "8ba", resume=True, workers=0)
    assert len(Numbers.fetched) == 2 * 8


def test_a_loader_without_state_says_what_a_resume_will_do(tmp_path):
    from torch.utils.data import DataLoader
    def run(resume):
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        return Trainer(model, DataLoader(Numbers(), batch_size=8, shuffle=True), max_duration="6ba",
                       save_folder=str(tmp_path), save_interval="3ba", autoresume=resume)
    run(False).fit(summary=False)
    for p in tmp_path.glob("ep0-ba6.pt"):
        p.unlink()
    with pytest.warns(UserWarning, match="keeps no state and has no resumable sampler: those batches are loaded and "
                                         "dropped"):
        run(True).fit(summary=False)


# ---------------------------------------------------------------------------- the data-wait share
def test_the_share_of_time_waiting_for_data_is_reported(tmp_path):
    import time as _time

    from hasten.loggers import LoggerDestination

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            _time.sleep(0.01)
            return torch.randn(8), i % 4

    class Keep(LoggerDestination):
        rows = []

        def log_metrics(self, metrics, step):
            self.rows.append(metrics)

    tr = Trainer(torch.nn.Linear(8, 4), torch.utils.data.DataLoader(Slow(), batch_size=8), max_duration="8ba",
                 log_interval="2ba", loggers=[Keep()])
    tr.fit(summary=False)
    assert tr.state.data_wait > 0.5   # the loader sleeps; the model is tiny: the loader is the bottleneck
    waits = [r["time/data_wait"] for r in Keep.rows if "time/data_wait" in r]
    assert waits and all(0.5 < w <= 1.0 for w in waits)
    from hasten.trainer import fit_summary
    assert "waiting for data" in fit_summary(tr.state, 1.0)


def test_nothing_on_hastens_path_imports_torchvision(prepared, tmp_path):
    z = image_zip(tmp_path / "img.zip", train=20, test=10)
    code = textwrap.dedent(f"""
        import sys
        from hasten.cli import main
        from hasten.data.prepare import prepare
        prepare({str(z)!r}, {str(tmp_path / 'imgs')!r}, shard_mb=0.01)
        rc = main(["train", "cifar10-baseline", "data.stream={tmp_path / 'imgs'}", "data.batch_size=8",
                   "data.num_workers=0", "trainer.max_duration=1ba", "trainer.eval_interval=1ba",
                   "trainer.run_dir={tmp_path / 'r'}", "--no-progress"])
        print(rc, "torchvision" in sys.modules)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert r.stdout.split()[-2:] == ["0", "False"], r.stdout[-300:] + r.stderr[-1000:]


def test_normalised_images_are_contiguous_channels_first():
    """A uint8 HWC image becomes a contiguous CHW tensor before padding and cropping: a permuted
    view would make every later per-sample operation walk strided memory."""
    from hasten.data.transforms import Normalize, RandomCropFlip
    x = torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8)
    y = Normalize((0, 0, 0), (1, 1, 1))(x)
    assert y.is_contiguous() and torch.equal(y, x.permute(2, 0, 1).float())
    out = RandomCropFlip((0, 0, 0), (1, 1, 1), pad=4, mode="reflect")(x, torch.Generator().manual_seed(0))
    assert out.shape == (3, 32, 32) and out.is_contiguous()


# ---------------------------------------------------------------------------- a source is what its manifest says
def _copy(prepared, to: Path) -> tuple[Path, dict]:
    shutil.copytree(prepared, to)
    return to, json.loads((to / MANIFEST).read_text())


def _first_error(split) -> str:
    """What reading the split's rows in order raises first: hasten's one line."""
    with pytest.raises(DataError) as e:
        for i in range(len(split)):
            split.row(i)
    return str(e.value)


@pytest.mark.parametrize("damage", ["same size, other bytes", "truncated", "a text file", "missing"])
def test_a_shard_that_is_not_the_one_its_manifest_lists_is_refused_before_its_rows_are_used(prepared, tmp_path, damage):
    src, m = _copy(prepared, tmp_path / "src")
    name = m["splits"]["train"]["shards"][2]["name"]
    shard = src / name
    data = bytearray(shard.read_bytes())
    if damage == "same size, other bytes":
        data[len(data) // 2] ^= 0x01                     # one bit: pyarrow would still read it, maybe
        shard.write_bytes(bytes(data))
    elif damage == "truncated":
        shard.write_bytes(bytes(data[:500]))
    elif damage == "a text file":
        shard.write_text("rows\n" * 50)
    else:
        shard.unlink()
    split = StreamSplit(str(src), "train")
    first_row_of_shard = sum(split.blocks[:2])
    for i in range(first_row_of_shard):                  # the shards before it are read as they are
        split.row(i)
    msg = _first_error(split)
    assert name in msg and "\n" not in msg
    assert {"same size, other bytes": "SHA-256", "truncated": "bytes", "a text file": "bytes",
            "missing": "missing"}[damage] in msg
    expected = hashlib.sha256(bytes(data)).hexdigest()[:12] if damage == "same size, other bytes" else None
    assert expected is None or expected in msg           # the digest of what is on disk, recomputed independently


def test_an_error_raised_in_a_loader_worker_is_the_same_one_line_as_without_workers(prepared, tmp_path):
    src, m = _copy(prepared, tmp_path / "src")
    (src / m["splits"]["train"]["shards"][0]["name"]).write_bytes(b"PAR1 not a shard")
    lines = {}
    for workers in (0, 2):
        r = subprocess.run([sys.executable, "-m", "hasten.cli", "train", "prose-gpt-baseline", f"data.source={src}",
                            f"data.num_workers={workers}", "trainer.max_duration=4ba",
                            f"trainer.run_dir={tmp_path / f'run{workers}'}", *TINY_GPT],
                           capture_output=True, text=True, timeout=300)
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("hasten: error:")]
        assert r.returncode == 1 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-1500:]
        lines[workers] = errors[0]
    assert lines[0] == lines[2] and "train-00000.parquet" in lines[0] and "prepare it again" in lines[0]


def test_errors_from_loader_workers_keep_their_own_message():
    """torch re-raises a worker's error with the worker's whole traceback as its message: hasten's
    errors take back their own message, others become one line naming where they were raised."""
    from torch.utils.data import DataLoader

    from hasten.cli import _unknown_one_line

    class Bad(torch.utils.data.Dataset):
        def __init__(self, error):
            self.error = error

        def __len__(self):
            return 4

        def __getitem__(self, i):
            raise self.error

    with pytest.raises(DataError) as e:
        list(DataLoader(Bad(DataError("shard s.parquet is damaged; prepare it again")), num_workers=1))
    assert str(e.value) == "shard s.parquet is damaged; prepare it again" and e.value.worker.where.startswith("in DataLoader worker")
    assert "Traceback" in e.value.worker.traceback
    with pytest.raises(OSError) as e:
        list(DataLoader(Bad(OSError(5, "the disk went away")), num_workers=1))
    assert "Traceback" in str(e.value)   # torch's own message, as torch makes it
    assert _unknown_one_line(e.value) == "OSError: [Errno 5] the disk went away (raised in DataLoader worker process 0)"
    assert _unknown_one_line(ValueError("plain\nerror")) == "ValueError: plain error"


@pytest.mark.parametrize("edit,needle", [
    (lambda m: m["splits"]["train"]["shards"][0].update(name=""), "shard whose name is not a file name"),
    (lambda m: m["splits"]["train"]["shards"][0].update(name="../outside.parquet"), "shard whose name is not a file name"),
    (lambda m: m["splits"]["train"]["shards"][0].update(name="sub/train-00000.parquet"), "shard whose name is not"),
    (lambda m: m.update(tokenizer="../planted/tok.json"), "tokenizer '../planted/tok.json' is not a file name"),
    (lambda m: m.update(tokenizer="/etc/tok.json"), "is not a file name inside the source"),
    (lambda m: m["splits"]["train"]["shards"][0].update(sha256="0" * 64), "digest is not the digest of the shards"),
])
def test_a_manifest_naming_anything_outside_its_source_or_not_its_shards_is_refused(prepared, tmp_path, edit, needle):
    src, m = _copy(prepared, tmp_path / "src")
    edit(m)
    (src / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(DataError, match=needle):
        read_manifest(str(src))


def test_a_shard_linked_from_outside_the_source_is_refused(prepared, tmp_path):
    src, m = _copy(prepared, tmp_path / "src")
    name = m["splits"]["train"]["shards"][0]["name"]
    (tmp_path / "elsewhere.parquet").write_bytes((src / name).read_bytes())   # the same bytes, outside
    (src / name).unlink()
    (src / name).symlink_to(tmp_path / "elsewhere.parquet")
    with pytest.raises(DataError, match="outside the source"):
        StreamSplit(str(src), "train").row(0)


def test_a_resume_on_a_source_prepared_again_is_refused_and_on_the_same_bytes_elsewhere_goes_on(prepared, tmp_path):
    src, m = _copy(prepared, tmp_path / "src")
    run = tmp_path / "run"
    r = run_cli("train", "prose-gpt-baseline", f"data.source={src}", "trainer.max_duration=8ba",
                "trainer.save_interval=4ba", "trainer.keep_last=2", f"trainer.run_dir={run}", *TINY_GPT)
    assert r.returncode == 0, r.stderr[-1500:]
    meta = json.loads(torch.load(run / "checkpoints" / "ep0-ba4.pt", weights_only=True)["meta"])
    assert meta["data"]["split"] == "train" and meta["data"]["manifest"] == hashlib.sha256(
        json.dumps([m["digest"], m["tokenizer_sha256"]]).encode()).hexdigest()
    (run / "checkpoints" / "ep0-ba8.pt").unlink()
    shutil.rmtree(src)
    again, _ = prepare(m["settings"]["source"], str(src), block_size=16, vocab_size=300, shard_mb=0.004, seed=1)
    assert again["tokenizer_sha256"] == m["tokenizer_sha256"] and again["digest"] != m["digest"]   # other shards
    r = subprocess.run([sys.executable, "-m", "hasten.cli", "train", "--resume", str(run), "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("hasten: error:")]
    assert r.returncode == 1 and len(errors) == 1, r.stderr[-1500:]
    assert "ep0-ba4.pt was trained on" in errors[0] and "now holds other data" in errors[0]
    shutil.rmtree(src)
    shutil.copytree(prepared, tmp_path / "moved")   # the bytes it was trained on, in another folder
    r = run_cli("train", "--resume", str(run), f"data.source={tmp_path / 'moved'}", "--force", "--no-progress")
    assert r.returncode == 0 and "resuming at batch 4" in r.stdout, r.stderr[-1500:]


def test_a_cached_shard_changed_on_disk_is_fetched_again_and_a_shard_missing_from_the_store_is_named(s3, prepared, tmp_path):
    import boto3
    source = json.loads((prepared / MANIFEST).read_text())["settings"]["source"]
    prepare(source, "s3://data/cached", block_size=16, vocab_size=300, shard_mb=0.004)
    cache = tmp_path / "c"
    split = StreamSplit("s3://data/cached", "train", cache_dir=str(cache))
    first = split.row(0)
    copy = next(p for p in cache.rglob("*.parquet"))
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0x01
    copy.write_bytes(bytes(data))                         # the cache's copy is not the shard any more
    again = StreamSplit("s3://data/cached", "train", cache_dir=str(cache)).row(0)
    assert all(np.array_equal(first[k], again[k]) for k in first)
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == split.shards[0]["sha256"]   # downloaded again
    name = split.shards[1]["name"]
    boto3.client("s3", endpoint_url=s3).delete_object(Bucket="data", Key=f"cached/{name}")
    with pytest.raises(DataError, match=f"{name}: the shard is missing from the store"):
        StreamSplit("s3://data/cached", "train", cache_dir=str(tmp_path / "c2")).row(split.blocks[0])
