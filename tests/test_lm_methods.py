"""Language-model methods: chunked cross-entropy, low-precision layer norm, token files, the HF adapter."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hasten.functional as hf
from hasten import Trainer
from hasten.algorithms import ChunkedCrossEntropy, LowPrecisionLayerNorm
from hasten.data import RandomWindows
from hasten.data.text import EvalWindows, load_token_file
from hasten.models import GPT, GPTConfig


@pytest.mark.parametrize("chunk", [7, 64, 1000])
def test_chunked_cross_entropy_matches_the_full_loss_and_gradients(chunk):
    torch.manual_seed(0)
    h = torch.randn(50, 16, requires_grad=True)
    w = torch.randn(300, 16, requires_grad=True)
    y = torch.randint(0, 300, (50,))
    g_out = torch.rand(50)
    ref = F.cross_entropy(h @ w.T, y, reduction="none")
    gh, gw = torch.autograd.grad((ref * g_out).sum(), (h, w))
    got = hf.chunked_cross_entropy(h, w, y, chunk)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    gh2, gw2 = torch.autograd.grad((got * g_out).sum(), (h, w))
    torch.testing.assert_close(gh2, gh, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw2, gw, rtol=1e-4, atol=1e-5)


def test_chunked_cross_entropy_in_the_trainer_equals_the_plain_run():
    tokens = torch.randint(0, 50, (4000,), generator=torch.Generator().manual_seed(0))
    cfg = GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16)

    def run(algos):
        torch.manual_seed(0)
        model = GPT(cfg)
        tr = Trainer(model, RandomWindows(tokens, 16, 4), eval_dataloader=EvalWindows(tokens[:400], 16, 8),
                     max_duration="5ba", device="cpu", algorithms=algos,
                     optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.5))
        tr.fit()
        return [p.detach() for p in model.parameters()], tr.evaluate()["val/loss"]

    plain, loss = run([])
    chunked, loss_c = run([ChunkedCrossEntropy(chunk_size=10)])
    for a, b in zip(plain, chunked):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert loss_c == pytest.approx(loss, rel=1e-5)


def test_low_precision_layer_norm_runs_in_bf16_and_matches_pytorch():
    ln = nn.LayerNorm(32)
    nn.init.normal_(ln.weight), nn.init.normal_(ln.bias)
    x = torch.randn(4, 8, 32)
    lp = nn.Sequential(ln)
    assert hf.apply_low_precision_layernorm(lp) == 1
    torch.testing.assert_close(lp(x), ln(x))                      # outside autocast: exactly LayerNorm
    with torch.autocast("cpu", torch.bfloat16):
        plain, low = ln(x), lp(x)
    assert plain.dtype == torch.float32 and low.dtype == torch.bfloat16
    want = F.layer_norm(x.bfloat16(), (32,), ln.weight.bfloat16(), ln.bias.bfloat16(), ln.eps)
    torch.testing.assert_close(low, want)                         # PyTorch's own bf16 kernel
    torch.testing.assert_close(low.float(), plain, rtol=0.05, atol=0.05)
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16))
    Trainer(model, device="cpu", algorithms=[LowPrecisionLayerNorm()], precision="bf16-mixed")
    assert sum(type(m).__name__ == "LPLayerNorm" for m in model.modules()) == 3


def test_token_files_are_memory_mapped_windows(tmp_path):
    ids = np.arange(1000, dtype=np.uint16) % 500
    ids.tofile(tmp_path / "train.bin")
    tokens = load_token_file(tmp_path / "train.bin")
    w = RandomWindows(tokens, block_size=8, batch_size=3)
    x, y = w.batch(0, 0)
    assert x.dtype == torch.long and torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal((x[:, 1:] - x[:, :-1]) % 500, torch.ones(3, 7, dtype=torch.long))
    with pytest.raises(FileNotFoundError, match="token file"):
        load_token_file(tmp_path / "absent.bin")


def test_gpt2_recipes_smoke_on_generated_token_files(tmp_path):
    from tiny import run_cli
    rng = np.random.default_rng(0)
    for split, n in (("train", 5000), ("val", 600)):
        rng.integers(0, 512, n).astype(np.uint16).tofile(tmp_path / f"{split}.bin")
    for recipe in ("gpt2-small-openwebtext-baseline", "gpt2-small-openwebtext-fast"):
        r = run_cli("train", recipe, f"data.train_file={tmp_path}/train.bin",
                    f"data.val_file={tmp_path}/val.bin", "data.block_size=16", "data.batch_size=8",
                    "data.eval_tokens=256", "model.vocab_size=512", "model.block_size=16", "model.n_layer=1",
                    "model.n_head=2", "model.n_embd=32", "trainer.grad_accum=2", "trainer.max_duration=4ba",
                    "trainer.eval_interval=4ba", "schedule.warmup=1ba", "--no-progress", cwd=tmp_path)
        assert r.returncode == 0, (recipe, r.stderr[-2000:])
        assert "val/loss=" in r.stdout


TINY_GPT2 = dict(n_layer=1, n_embd=32, n_head=2, vocab_size=65, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
                 attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)


def test_hugging_face_causal_lm_trains_under_the_trainer():
    transformers = pytest.importorskip("transformers")
    from hasten.integrations.hf import HFCausalLM
    torch.manual_seed(0)
    model = HFCausalLM.from_config("gpt2", **TINY_GPT2)
    from hasten.data import load_text
    from hasten.data.text import CharTokenizer
    text = load_text()[:20000]
    tokens = CharTokenizer(text).encode(text)
    data = RandomWindows(tokens, 16, 8)
    x, y = data.batch(0, 0)
    ref = model.model(input_ids=x, labels=x).loss          # Hugging Face's own shifted loss
    ours = F.cross_entropy(model(x)[:, :-1].reshape(-1, 65), y[:, :-1].reshape(-1))
    torch.testing.assert_close(ours, ref)
    tr = Trainer(model, data, eval_dataloader=EvalWindows(tokens[-2000:], 16, 16), max_duration="30ba", device="cpu",
                 optimizers=lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3))
    before = tr.evaluate()["val/loss"]
    tr.fit()
    assert tr.state.eval_metrics["val/loss"] < before - 0.3
    assert isinstance(model.model, transformers.PreTrainedModel)
    chunked = HFCausalLM.from_config("gpt2", **TINY_GPT2)
    chunked.load_state_dict(model.state_dict())
    with torch.no_grad():
        plain = F.cross_entropy(model(x).reshape(-1, 65), y.reshape(-1), reduction="none")
        chunked.output_hidden = True
        got = hf.chunked_cross_entropy(chunked(x), chunked.lm_head.weight, y, 50)
    torch.testing.assert_close(got, plain, rtol=1e-4, atol=1e-5)


def test_float8_training_converts_by_the_rule_and_stays_near_bf16():
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    from hasten.algorithms import Float8Training
    from hasten.functional import convert_to_float8, should_convert
    from hasten.models.gpt import GPT, GPTConfig
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=64, vocab_size=96, block_size=16, dropout=0.0)
    torch.manual_seed(0)
    ref = GPT(cfg)
    f8 = GPT(cfg)
    f8.load_state_dict(ref.state_dict())
    names = convert_to_float8(f8, min_elements=64 * 64)
    # the rule: multiples of 16, at least 64 x 64 weights, not the head (by name)
    assert names and all(isinstance(f8.get_submodule(n), Float8Linear) for n in names)
    assert not any("head" in n for n in names)
    assert not should_convert(torch.nn.Linear(64, 24), "x", 0) and not should_convert(torch.nn.Linear(32, 32), "x", 4096)
    x = torch.randint(0, 96, (4, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = ref(x).float(), f8(x).float()
    # float8 (e4m3, scaled per tensor) against bf16: within a few percent of the logits' scale
    assert (a - b).abs().mean() < 0.05 * a.abs().mean()
    with pytest.raises(ValueError, match="no Linear layer"):
        Trainer(GPT(cfg), [(x, x)], max_duration="1ba", precision="bf16-mixed",
                algorithms=[Float8Training(min_elements=10**9)])
    # training under CPU autocast: torchao casts inputs for CUDA's autocast only, and CPU
    # autocast then cast its float8 operands (aten.to.dtype, refused); hasten's layer handles it
    t = Trainer(GPT(cfg), [(x, x)] * 2, max_duration="2ba", precision="bf16-mixed",
                algorithms=[Float8Training(min_elements=0)])
    t.fit(summary=False)
    assert all(torch.isfinite(v) for v in t.state.step_losses)
