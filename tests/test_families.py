"""The model families: corpora read by document and tokenized (BPE), documents kept apart in
attention, masked-LM pre-training and its loss, text classification fine-tuned from a
pre-trained encoder, the ViT, and Hugging Face models of each kind from a recipe."""
import gzip
import hashlib
import json
import zipfile

import numpy as np
import pytest
import torch


from hasten.data.corpus import (EOD, content_hash, corpus_tokenizer, pack, read_documents, split_documents,
                                tokenized_corpus)
from hasten.data.masking import mask_tokens
from hasten.errors import DataError
from hasten.models import BERT, GPT, GPTConfig, ViT
from hasten.tasks.text_classification import strip_headers

from tiny import run_cli

WORDS = ("the quick brown fox jumps over a lazy dog while seven wise owls sing of rivers and stone "
         "under pale moons a merchant counts his silver and the sea keeps its own counsel").split()


def _corpus(tmp_path, docs=30, words=120, seed=0):
    rng = np.random.default_rng(seed)
    path = tmp_path / "corpus.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i in range(docs):
            text = " ".join(rng.choice(WORDS, words)) + "."
            f.write(json.dumps({"title": f"doc{i}", "text": text}) + "\n")
    return path


def test_documents_from_every_shape_a_user_has_and_a_split_by_document(tmp_path):
    (tmp_path / "one.txt").write_text("a single document")
    folder = tmp_path / "folder"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.txt").write_text(f"document {i}")
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as z:
        z.writestr("b.txt", "second")
        z.writestr("a.txt", "first")
    assert [d.text for d in read_documents(str(tmp_path / "one.txt"))] == ["a single document"]
    assert [d.text for d in read_documents(str(folder))] == ["document 0", "document 1", "document 2"]
    assert [d.text for d in read_documents(str(tmp_path / "a.zip"))] == ["first", "second"]
    docs = read_documents(str(_corpus(tmp_path)))
    assert len(docs) == 30 and docs[0].meta == {"title": "doc0"}
    train, val = split_documents(docs, 10)
    assert [d.meta["title"] for d in val] == ["doc9", "doc19", "doc29"] and len(train) == 27
    (tmp_path / "bad.jsonl").write_text('{"body": "no text field"}\n')
    with pytest.raises(DataError, match="no text field 'text'"):
        read_documents(str(tmp_path / "bad.jsonl"))


def test_a_corpus_by_url_is_downloaded_once_and_checked(tmp_path, monkeypatch):
    src = _corpus(tmp_path)
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    docs = read_documents(f"{src.as_uri()}#sha256={sha}")
    assert len(docs) == 30
    src.unlink()   # the second time it is not fetched again
    assert len(read_documents(f"{src.as_uri()}#sha256={sha}")) == 30
    with pytest.raises(DataError, match="sha256"):
        read_documents(f"{_corpus(tmp_path, seed=1).as_uri()}")


@pytest.mark.parametrize("fragment", ["sha256=../../../E/x", "sha256=abc", "sha256=" + "g" * 64,
                                      "sha256=" + "a" * 63 + "/"])
def test_a_checksum_that_is_not_64_hex_digits_is_refused_and_builds_no_path(tmp_path, fragment):
    from hasten.data.download import data_root
    src = _corpus(tmp_path)
    with pytest.raises(DataError, match="not a SHA-256 .64 hexadecimal digits"):
        read_documents(f"{src.as_uri()}#{fragment}")
    assert not (tmp_path / "E").exists() and not (data_root() / "corpora").exists()


def test_a_cached_download_is_keyed_by_its_whole_checksum_and_checked_before_each_use(tmp_path):
    from hasten.data.download import data_root
    src = _corpus(tmp_path)
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    read_documents(f"{src.as_uri()}#sha256={sha}")
    cached = data_root() / "corpora" / sha / src.name
    assert cached.is_file()
    other = sha[:12] + ("0" if sha[12] != "0" else "1") + sha[13:]   # the same first 12 digits, another hash
    with pytest.raises(DataError, match="expected"):   # not served the cached file: fetched and checked
        read_documents(f"{src.as_uri()}#sha256={other}")
    cached.write_text('{"text": "planted"}\n')
    with pytest.raises(DataError, match="changed on disk"):
        read_documents(f"{src.as_uri()}#sha256={sha}")


def test_bpe_is_trained_on_training_documents_only_and_cached(tmp_path):
    docs = read_documents(str(_corpus(tmp_path)))
    train, _ = split_documents(docs, 10)
    tok = corpus_tokenizer(train, 300)
    again = corpus_tokenizer(train, 300)
    assert tok.tok.to_str() == again.tok.to_str() and tok.token_id(EOD) == 0
    assert tok.decode(tok.encode("the quick brown fox")) == "the quick brown fox"
    other = corpus_tokenizer(train[:5], 300)   # other training text: another tokenizer, not the cached one
    assert content_hash(train[:5]) != content_hash(train)
    assert other.tok.to_str() != tok.tok.to_str()
    c = tokenized_corpus(str(_corpus(tmp_path)), vocab_size=300)
    tokens, segments = pack([np.array([5, 6]), np.array([7])], eod=0)
    assert tokens.tolist() == [5, 6, 0, 7, 0] and segments.tolist() == [0, 0, 0, 1, 1]
    assert c.documents == (27, 3) and (c.val_tokens == c.tokenizer.token_id(EOD)).sum() == 3


@pytest.mark.parametrize("make", ["gpt", "bert"])
def test_no_token_attends_across_a_document_boundary(make):
    torch.manual_seed(0)
    model = (GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32)) if make == "gpt"
             else BERT(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0)).eval()
    idx = torch.randint(0, 50, (1, 16))
    seg = torch.tensor([[0] * 6 + [1] * 10])
    changed = idx.clone()
    changed[0, :6] = torch.randint(0, 50, (6,))   # another first document
    with torch.no_grad():
        a, b = model(idx, segments=seg), model(changed, segments=seg)
        plain_a, plain_b = model(idx), model(changed)
    torch.testing.assert_close(a[0, 6:], b[0, 6:], rtol=0, atol=1e-6)   # the second document never saw the first
    assert not torch.allclose(plain_a[0, 6:], plain_b[0, 6:])            # without the mask it does
    if make == "gpt":   # within a document it is still causal: the first document's last token sees its own past
        changed2 = idx.clone()
        changed2[0, 10] = (idx[0, 10] + 1) % 50
        with torch.no_grad():
            c = model(changed2, segments=seg)
        torch.testing.assert_close(a[0, :10], c[0, :10], rtol=0, atol=1e-6)


def test_masking_draws_bert_shares_and_never_masks_special_tokens():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (64, 128))
    ids[:, ::16] = 0   # special tokens
    inputs, targets = mask_tokens(ids, g, 0.15, mask_id=1, vocab_size=1000, special_ids=(0,))
    chosen = targets != -100
    assert 0.13 < chosen.float().mean() < 0.155 and not chosen[:, ::16].any()
    assert torch.equal(targets[chosen], ids[chosen]) and torch.equal(inputs[~chosen], ids[~chosen])
    masked = (inputs[chosen] == 1).float().mean()
    kept = (inputs[chosen] == ids[chosen]).float().mean()
    assert 0.77 < masked < 0.83 and 0.08 < kept < 0.13


def test_hastens_masked_lm_loss_on_an_hf_bert_equals_hfs_own_labels_loss(tmp_path):
    pytest.importorskip("transformers")
    from hasten import Trainer
    from hasten.integrations.hf import build_model
    torch.manual_seed(0)
    model = build_model("masked_lm", "bert", vocab_size=120, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 120, (8, 32), generator=g)
    inputs, targets = mask_tokens(ids, g, 0.15, mask_id=1, vocab_size=120)
    with torch.no_grad():
        theirs = model.model(input_ids=inputs, labels=targets).loss.item()
    tr = Trainer(model, [(inputs, targets)], eval_dataloader=[(inputs[:3], targets[:3]), (inputs[3:], targets[3:])],
                 max_duration="1ba", device="cpu", optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.0))
    assert tr.evaluate()["val/loss"] == pytest.approx(theirs, rel=1e-5)


def test_headers_are_kept_cut_to_the_subject_or_dropped():
    mail = "From: a@b.c\nSubject: cheap pills\nX-Spam: yes\n\nBuy now.\n\nBye"
    assert strip_headers(mail, "keep") == mail
    assert strip_headers(mail, "subject") == "Subject: cheap pills\n\nBuy now.\n\nBye"
    assert strip_headers(mail, "drop") == "Buy now.\n\nBye"
    assert strip_headers("no headers here\n\nat all", "drop") == "no headers here\n\nat all"


def test_pretrain_then_fine_tune_from_the_checkpoint(tmp_path, monkeypatch):
    """masked_lm on a tiny corpus, then text_classification started from its weights: the
    encoder's tensors load, the head starts fresh, the tokenizer is the same one."""
    corpus = _corpus(tmp_path, docs=40, words=200)
    rng = np.random.default_rng(0)
    with gzip.open(tmp_path / "labelled.jsonl.gz", "wt") as f:
        for i in range(120):
            label = "spam" if i % 3 == 0 else "ham"
            words = ["silver", "merchant"] if label == "spam" else ["owls", "river"]
            text = f"Subject: note {i}\nFrom: x\n\n" + " ".join(list(rng.choice(WORDS, 30)) + words * 3)
            f.write(json.dumps({"label": label, "id": str(i), "folder": "hard" if i % 10 == 0 else "easy",
                                "text": text}) + "\n")
    model = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32"]
    pre = run_cli("train", "prose-bert-baseline", f"data.source={corpus}", "data.vocab_size=300", "data.block_size=32",
                  "data.batch_size=8", "trainer.max_duration=6ba", "trainer.eval_interval=6ba", "schedule.warmup=1ba",
                  *model, f"trainer.run_dir={tmp_path / 'pre'}", "trainer.precision=fp32", "--no-progress")
    assert pre.returncode == 0, pre.stderr
    assert "val/acc=" in pre.stdout
    ft = run_cli("train", "spam-bert-finetune", f"data.source={tmp_path / 'labelled.jsonl.gz'}",
                 f"data.tokenizer_source={corpus}", "data.vocab_size=300", "data.block_size=48", "data.batch_size=16",
                 "data.val_folders=[hard]", "trainer.max_duration=8ba", "trainer.eval_interval=8ba", *model,
                 f"trainer.load_path={tmp_path / 'pre'}", f"trainer.run_dir={tmp_path / 'ft'}", "trainer.precision=fp32",
                 "--no-progress")
    assert ft.returncode == 0, ft.stderr
    assert "starting from the weights of" in ft.stdout and "fresh: head.bias, head.weight" in ft.stdout
    assert "val/f1=" in ft.stdout


def test_vit_sizes_and_token_dropping():
    torch.manual_seed(0)
    v = ViT(image_size=32, patch_size=4, width=32, depth=1, heads=2)
    x = torch.randn(2, 3, 32, 32)
    assert v(x).shape == (2, 10) and v(torch.randn(2, 3, 24, 24)).shape == (2, 10)   # another size: positions resized
    v.eval()
    with torch.no_grad():
        ref = v(x)
        v.keep = 0.5   # token dropping acts in training only
        torch.testing.assert_close(v(x), ref)
    v.train()
    assert v(x).shape == (2, 10)


@pytest.mark.parametrize("task, model", [
    ("lm", "hf/gpt2"), ("masked_lm", "hf/bert"), ("text_classification", "hf/bert"), ("image_classification", "hf/vit")])
def test_hugging_face_models_of_each_kind_train_from_a_recipe(tmp_path, task, model):
    pytest.importorskip("transformers")
    corpus = _corpus(tmp_path)
    section = {"hf/gpt2": "n_layer: 1, n_embd: 32, n_head: 2, n_positions: 32",
               "hf/bert": "hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64, "
                          "max_position_embeddings: 64",
               "hf/vit": "hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64, "
                         "patch_size: 8"}[model]
    if task == "lm":
        args = ["prose-gpt-baseline", f"data.source={corpus}", "data.vocab_size=300", "data.block_size=16"]
    elif task == "masked_lm":
        args = ["prose-bert-baseline", f"data.source={corpus}", "data.vocab_size=300", "data.block_size=16"]
    elif task == "text_classification":
        with gzip.open(tmp_path / "l.jsonl.gz", "wt") as f:
            for i in range(40):
                f.write(json.dumps({"label": str(i % 2), "id": str(i), "text": " ".join(WORDS[i % 5:i % 5 + 8])}) + "\n")
        args = ["spam-bert-finetune", f"data.source={tmp_path / 'l.jsonl.gz'}", f"data.tokenizer_source={corpus}",
                "data.vocab_size=300", "data.block_size=16", "data.val_folders=[]"]
    else:
        from tiny import image_zip
        args = ["cifar10-vit-baseline", f"data.path={image_zip(tmp_path / 'i.zip', 32, 16)}"]
    r = run_cli("train", *args, f"model={{name: {model}, {section}}}", "data.batch_size=8", "trainer.max_duration=2ba",
                "trainer.eval_interval=2ba", "schedule.warmup=1ba", "trainer.precision=fp32",
                f"trainer.run_dir={tmp_path / 'run'}", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "val/loss=" in r.stdout


def test_compress_takes_a_bert_run_structured_and_unstructured(tmp_path):
    corpus = _corpus(tmp_path, docs=30, words=150)
    r = run_cli("train", "prose-bert-fast", f"data.source={corpus}", "data.vocab_size=300", "data.block_size=32",
                "data.batch_size=8", "trainer.max_duration=4ba", "trainer.eval_interval=4ba", "model.n_layer=1",
                "model.n_head=4", "model.n_embd=32", f"trainer.run_dir={tmp_path / 'run'}", "trainer.precision=fp32",
                "--no-progress")
    assert r.returncode == 0, r.stderr
    c = run_cli("compress", tmp_path / "run", "--structured", "0.5", "--prune", "0.3", "--no-latency",
                "--out", tmp_path / "small.hasten")
    assert c.returncode == 0, c.stderr
    report = json.loads((tmp_path / "small.json").read_text())
    assert report["model_changes"]["n_head"] == 2 and report["parameters"]["after"] < report["parameters"]["before"]
    assert "val/loss" in report["after"] and "val/acc" in report["after"]
