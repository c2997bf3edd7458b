"""Muon: orthogonalised updates (singular values near 1), 4-D kernels, the split, recipes."""
import pytest
import torch
from torch import nn

from hasten.models import GPT, GPTConfig
from hasten.optim import ConvMuon, muon_optimizers, split_for_muon


def _update(opt_cls, p0, grad, **kw):
    p = nn.Parameter(p0.clone())
    opt = opt_cls([p], lr=1.0, weight_decay=0.0, momentum=0.0, nesterov=False, **kw)
    p.grad = grad.clone()
    opt.step()
    return (p0 - p.detach())


def test_orthogonalised_update_has_singular_values_near_one():
    torch.manual_seed(0)
    # a gradient with a wide spread of singular values (condition number 100)
    u, _ = torch.linalg.qr(torch.randn(64, 64))
    v, _ = torch.linalg.qr(torch.randn(32, 32))
    s = torch.logspace(0, -2, 32)
    grad = u[:, :32] @ torch.diag(s) @ v.T
    upd = _update(torch.optim.Muon, torch.zeros(64, 32), grad)
    # torch scales the update by sqrt(max(1, rows/cols)) ('original' adjustment)
    sv = torch.linalg.svdvals(upd / (64 / 32) ** 0.5)
    assert sv.min() > 0.5 and sv.max() < 1.3, sv
    assert torch.linalg.svdvals(grad).max() / torch.linalg.svdvals(grad).min() > 50


def test_conv_muon_equals_muon_on_the_flattened_kernel_in_any_layout():
    torch.manual_seed(0)
    w, g = torch.randn(16, 8, 3, 3), torch.randn(16, 8, 3, 3)
    ref = _update(torch.optim.Muon, w.view(16, -1), g.view(16, -1)).view(16, 8, 3, 3)
    ours = _update(ConvMuon, w, g)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)
    cl = _update(ConvMuon, w.to(memory_format=torch.channels_last), g.to(memory_format=torch.channels_last))
    torch.testing.assert_close(cl, ref, rtol=1e-3, atol=1e-4)


def test_split_sends_hidden_matrices_to_muon_and_the_rest_to_adamw():
    m = GPT(GPTConfig(n_layer=2))
    hidden, other = split_for_muon(m)
    names = {n for n, _ in hidden}
    assert "blocks.0.attn.qkv.weight" in names and "blocks.1.mlp.proj.weight" in names
    assert not any("wte" in n or "wpe" in n or "ln" in n for n in names)
    opts = muon_optimizers(m)
    assert isinstance(opts[0], torch.optim.Muon) and isinstance(opts[1], torch.optim.AdamW)
    total = sum(p.numel() for o in opts for g in o.param_groups for p in g["params"])
    assert total == sum(p.numel() for p in m.parameters())   # tied head counted once


def test_muon_recipe_trains():
    from hasten.build import build_run
    from hasten.config import load_recipe
    r = load_recipe("shakespeare-char-baseline", ["optimizer.name=muon", "trainer.max_duration=30ba",
                                                  "trainer.eval_interval=30ba", "model.n_layer=1",
                                                  "trainer.checkpoints=false", "trainer.tensorboard=false",
                                                  "trainer.progress_bar=false", "optimizer.lr=3e-3"])
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        r.trainer.run_dir = d
        run = build_run(r, console_logger=False)
        first = run.trainer.evaluate()["val/loss"]
        run.trainer.fit()
        assert len(run.trainer.state.optimizers) == 2
        assert run.trainer.state.eval_metrics["val/loss"] < first - 0.3
