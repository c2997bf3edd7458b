"""Datasets and loaders: downloads with checksums, CIFAR readers, reproducible order."""
import hashlib
import io
import pickle
import tarfile
import zipfile

import numpy as np
import pytest
import torch

from hasten.data import (ChecksumError, DatasetNotFoundError, EvalWindows, RandomWindows, ResumableSampler,
                         TensorPairs, epoch_iterator, load_text, make_dataloader)
from hasten.data.cifar import CLASSES, load_cifar10, read_image_zip
from hasten.data.text import CharTokenizer, compact_dtype


def _fake_cifar_archive(path, n_per_batch=10):
    rng = np.random.default_rng(0)
    batches = {}
    with tarfile.open(path, "w:gz") as tar:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            data = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
            labels = rng.integers(0, 10, n_per_batch).tolist()
            batches[name] = (data, labels)
            blob = pickle.dumps({b"data": data, b"labels": labels})
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return batches


def test_download_from_file_url_with_checksum(tmp_path, monkeypatch):
    archive = tmp_path / "served.tar.gz"
    batches = _fake_cifar_archive(archive)
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    data = load_cifar10(url=archive.as_uri(), md5=md5)
    assert data.train_x.shape == (50, 32, 32, 3) and data.test_x.shape == (10, 32, 32, 3)
    first = batches["data_batch_1"][0][0].reshape(3, 32, 32).transpose(1, 2, 0)
    assert np.array_equal(data.train_x[0].numpy(), first)
    assert data.train_y[:10].tolist() == batches["data_batch_1"][1]
    # second call reads the cached archive, no URL needed
    again = load_cifar10(url="file:///nonexistent", md5=md5)
    assert torch.equal(again.train_x, data.train_x)


def test_download_checksum_mismatch_is_refused_and_deleted(tmp_path):
    archive = tmp_path / "served.tar.gz"
    _fake_cifar_archive(archive)
    with pytest.raises(ChecksumError, match="expected 0000"):
        load_cifar10(url=archive.as_uri(), md5="0" * 32)
    assert not list((tmp_path / "hasten-data" / "cifar10").glob("*.tar.gz"))


def test_missing_dataset_without_network_says_where_to_put_it(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="put it at .*cifar-10-python.tar.gz"):
        load_cifar10(url=(tmp_path / "absent.tar.gz").as_uri())
    with pytest.raises(DatasetNotFoundError, match="no CIFAR-10 at"):
        load_cifar10(tmp_path / "nowhere")


def test_official_folder_and_archive_paths(tmp_path):
    archive = tmp_path / "cifar-10-python.tar.gz"
    _fake_cifar_archive(archive)
    a = load_cifar10(archive)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    b = load_cifar10(tmp_path / "x")
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)


def test_pickled_code_in_batches_is_refused(tmp_path):
    import os

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (d / name).write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_cifar10(tmp_path)


def test_image_zip_is_decoded_in_order_and_cached(tmp_path):
    from PIL import Image
    path = tmp_path / "imgs.zip"
    rng = np.random.default_rng(0)
    imgs = {}
    with zipfile.ZipFile(path, "w") as zf:
        for split, n in (("train", 6), ("test", 4)):
            for i in range(n):
                cls = CLASSES[i % 3]
                arr = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                buf = io.BytesIO()
                Image.fromarray(arr).save(buf, format="PNG")
                zf.writestr(f"{split}/{cls}/{i:05d}.png", buf.getvalue())
                imgs[(split, i)] = (arr, i % 3)
    data = read_image_zip(path, cache_dir=tmp_path / "cache")
    for i in range(6):   # train: in index order
        assert np.array_equal(data.train_x[i].numpy(), imgs[("train", i)][0])
        assert data.train_y[i] == imgs[("train", i)][1]
    assert sorted(data.test_y.tolist()) == data.test_y.tolist()   # test: grouped by class
    assert list((tmp_path / "cache").glob("*.npz"))
    again = read_image_zip(path, cache_dir=tmp_path / "cache")
    assert torch.equal(again.train_x, data.train_x)


def test_shared_cifar_zip_when_present(cifar_zip, tmp_path):
    data = read_image_zip(cifar_zip, cache_dir=tmp_path)
    assert data.train_x.shape == (50000, 32, 32, 3) and data.test_x.shape == (10000, 32, 32, 3)
    assert torch.bincount(data.train_y).tolist() == [5000] * 10
    means = data.train_x.float().mean((0, 1, 2))
    assert torch.allclose(means, torch.tensor([125.3, 123.0, 113.9]), atol=1.5)


def test_resumable_sampler_is_a_permutation_per_epoch_and_starts_part_way():
    s = ResumableSampler(10, shuffle=True, seed=3)
    s.set_epoch(0)
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    assert sorted(e0) == list(range(10)) and e0 != e1
    s.set_epoch(1, skip=4)
    assert list(s) == e1[4:]


def _noise(x, g):
    return x + torch.randn(x.shape, generator=g)


@pytest.mark.parametrize("workers", [0, 2])
def test_augmentation_independent_of_worker_count(workers):
    ds = TensorPairs(torch.zeros(20, 3), torch.arange(20))
    ref = [b for b in epoch_iterator(make_dataloader(ds, 4, seed=5, transform=_noise, num_workers=0), 5, 1)]
    got = [b for b in epoch_iterator(make_dataloader(ds, 4, seed=5, transform=_noise, num_workers=workers), 5, 1)]
    for (x1, y1), (x2, y2) in zip(ref, got):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    skipped = list(epoch_iterator(make_dataloader(ds, 4, seed=5, transform=_noise, num_workers=workers), 5, 1, 2))
    assert len(skipped) == 3 and torch.equal(skipped[0][0], ref[2][0])


def test_char_encoding_matches_a_lookup_per_character_in_any_dtype():
    """The vectorised encoder against the plain per-character dictionary lookup, over the
    packaged corpus and over text outside ASCII (accents, a euro sign, an emoji)."""
    for text in (load_text(), "naïve café — 5 € 🙂\nzürich"):
        tok = CharTokenizer(text)
        reference = torch.tensor([tok.stoi[c] for c in text], dtype=torch.long)
        assert torch.equal(tok.encode(text), reference)
        small = tok.encode(text, compact_dtype(tok.vocab_size))
        assert small.dtype == torch.uint8 and torch.equal(small.long(), reference)
        assert tok.decode(tok.encode(text[:200])) == text[:200]
    assert compact_dtype(256) == torch.uint8 and compact_dtype(257) == torch.int16 and compact_dtype(50257) == torch.int32
    with pytest.raises(ValueError, match="'Z' is not in the vocabulary"):
        CharTokenizer("abc").encode("abZc")
    with pytest.raises(ValueError, match="'a' is not in the vocabulary"):
        CharTokenizer("").encode("a")
    assert CharTokenizer("abc").encode("").shape == (0,)


def test_windows_over_compact_tokens_equal_those_over_int64():
    """A corpus kept in uint8 (or a memory-mapped uint16 file) gives the same int64 batches as
    the same ids in int64, training and evaluation alike."""
    ids = torch.randint(0, 65, (5000,), generator=torch.Generator().manual_seed(0))
    wide = RandomWindows(ids, block_size=16, batch_size=6, seed=3)
    narrow = RandomWindows(ids.to(torch.uint8), block_size=16, batch_size=6, seed=3)
    assert narrow.tokens.dtype == torch.uint8   # kept compact, not widened up front
    for i in range(3):
        (xw, yw), (xn, yn) = wide.batch(0, i), narrow.batch(0, i)
        assert xn.dtype == yn.dtype == torch.long and torch.equal(xw, xn) and torch.equal(yw, yn)
    mapped = np.asarray(ids.numpy(), dtype=np.uint16)
    for tokens in (ids.to(torch.uint8), mapped):
        got, want = list(EvalWindows(tokens, 64, 7)), list(EvalWindows(ids, 64, 7))
        assert len(got) == len(want) and all(x.dtype == torch.long and torch.equal(x, xw) and torch.equal(y, yw)
                                             for (x, y), (xw, yw) in zip(got, want))


def test_the_char_task_keeps_its_corpus_in_a_byte_a_character(tmp_path):
    from hasten.build import build_run
    from hasten.config import load_recipe
    run = build_run(load_recipe("shakespeare-char-baseline", [f"trainer.run_dir={tmp_path}/run"]),
                    progress_bar=False, console_logger=False)
    try:
        train = run.built.train_dataloader
        assert train.tokens.dtype == torch.uint8 and len(train.tokens) == 1003854
        x, y = next(iter(train))
        assert x.dtype == y.dtype == torch.long
    finally:
        run.close()


def test_text_windows():
    text = load_text()
    assert len(text) == 1115394
    tok = CharTokenizer(text)
    assert tok.vocab_size == 65 and tok.decode(tok.encode("First Citizen")) == "First Citizen"
    tokens = torch.arange(1000)
    rw = RandomWindows(tokens, block_size=8, batch_size=4, seed=0)
    x, y = rw.batch(0, 3)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y, x + 1)
    assert torch.equal(rw.batch(0, 3)[0], x) and not torch.equal(rw.batch(1, 3)[0], x)
    assert len(list(rw.iter_epoch(0, skip_batches=len(rw) - 2))) == 2
    ev = EvalWindows(tokens, block_size=64, batch_size=5)
    xs = torch.cat([b[0] for b in ev])
    assert xs.shape == (15, 64) and torch.equal(xs.flatten(), tokens[:960])   # (1000-1)//64 = 15 windows
