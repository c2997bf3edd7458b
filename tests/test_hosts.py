"""hasten's methods inside Lightning and the Hugging Face Trainer: each supported method has
the effect it has in hasten's own Trainer (checked against hasten's Trainer run on the same
model and data, or against PyTorch's own formula), and what cannot run is refused at set-up."""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from hasten import Trainer
from hasten.algorithms import (EMA, SAM, ActivationSwap, ChannelsLast, GradientClipping, InfoBatch, LabelSmoothing,
                               MixUp, ProgressiveResizing, SeqLenWarmup, TTA)
from hasten.integrations.host import HOST_EVENTS, refusal
from hasten.optim.combined import CombinedOptimizer
from hasten.optim.muon import muon_optimizers
from hasten.registry import ALGORITHMS

L = pytest.importorskip("lightning")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from hasten.integrations.hf import HastenTrainer, muon_optimizer  # noqa: E402
from hasten.integrations.lightning import HastenCallback  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _data(n=64, d=8, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)


def _mlp(seed=0, d=8, classes=3):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d, 16), torch.nn.ReLU(), torch.nn.Linear(16, classes))


class Module(L.LightningModule):
    """The one-line change: the training loss goes through self.loss_fn."""

    def __init__(self, net, lr=0.1):
        super().__init__()
        self.net, self.lr, self.loss_fn = net, lr, F.cross_entropy
        self.seen = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, i):
        x, y = batch
        logits = self(x)
        loss = self.loss_fn(logits, y)
        self.seen.append({"x_shape": tuple(x.shape), "loss": loss.detach(),
                          "smoothed": F.cross_entropy(logits.detach(), y, label_smoothing=0.1)
                          if not isinstance(y, tuple) else None})
        return loss

    def on_before_optimizer_step(self, optimizer):   # after hasten's callback: clipped gradients
        self.seen[-1]["grad_norm"] = torch.linalg.vector_norm(
            torch.stack([p.grad.norm() for p in self.parameters() if p.grad is not None]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _lightning(module, loader, algorithms, steps=8, val=None):
    cb = HastenCallback(algorithms)
    L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, callbacks=[cb], num_sanity_val_steps=0,
              limit_val_batches=0 if val is None else 1.0).fit(module, loader, val)
    return cb


def _loader(x, y, bs=16):
    return DataLoader(TensorDataset(x, y), batch_size=bs, shuffle=False)


# ---------------------------------------------------------------------------- refusals
def test_every_registered_method_is_either_supported_in_a_host_or_refused_with_a_reason():
    defaults = {"proxy_selection": {"proxy": torch.nn.Linear(2, 2)}}
    for name, cls in ALGORITHMS.items():
        algo = cls(**defaults.get(name, {}))
        why = refusal(algo, "a host")
        if why is None:
            assert set(cls.listens_to()) <= HOST_EVENTS, name
        else:
            assert len(why) > 30 and "\n" not in why, (name, why)
    for algo in (SAM(), TTA(), InfoBatch()):
        with pytest.raises(ValueError, match="cannot run in Lightning"):
            HastenCallback([algo])
        with pytest.raises(ValueError, match="cannot run in the Hugging Face Trainer"):
            HastenTrainer(model=_mlp(), args=transformers.TrainingArguments(output_dir="unused", use_cpu=True,
                                                                           report_to=[]), algorithms=[algo])


def test_both_hosts_take_the_host_allocator_and_name_a_bad_mode(tmp_path, monkeypatch):
    """The mode reaches the allocator at set-up (here recorded, not applied: the settings are
    process-wide; tests/test_allocator.py checks their effect in fresh processes)."""
    import hasten.integrations.host as host
    calls = []
    monkeypatch.setattr(host, "configure_host_allocator", lambda mode, device_type: calls.append((mode, device_type)))
    assert HastenCallback([], host_allocator="auto").host.host_allocator == "auto"
    HastenTrainer(model=_mlp(), args=_args(tmp_path, 1), train_dataset=TensorDataset(*_data()), host_allocator="auto")
    assert calls == [("auto", "cpu")]
    with pytest.raises(ValueError, match="Lightning: host_allocator='fast' is not a mode: use one of auto"):
        HastenCallback([], host_allocator="fast")
    with pytest.raises(ValueError, match="Hugging Face Trainer: host_allocator='fast'"):
        HastenTrainer(model=_mlp(), args=_args(tmp_path, 1), host_allocator="fast")


def test_a_loss_method_without_the_modules_loss_fn_is_refused_at_setup_with_the_fix():
    class NoLossFn(Module):
        def __init__(self, net):
            super().__init__(net)
            del self.loss_fn

        def training_step(self, batch, i):
            return F.cross_entropy(self(batch[0]), batch[1])

    x, y = _data()
    with pytest.raises(ValueError, match="loss_fn"):
        _lightning(NoLossFn(_mlp()), _loader(x, y), [LabelSmoothing(0.1)])


def test_the_support_table_in_the_docs_is_current():
    from pathlib import Path

    from hasten.integrations.host import support_table
    doc = (Path(__file__).parent.parent / "docs" / "integrations.md").read_text()
    table = doc.split("<!-- support table -->\n", 1)[1].split("<!-- end support table -->", 1)[0]
    assert table == support_table(), "docs/integrations.md is stale: paste python -m hasten.integrations.host"


# ---------------------------------------------------------------------------- Lightning: effects
def test_lightning_ema_leaves_the_same_weights_as_hastens_trainer():
    # after fit the module holds the average (no final evaluation in Lightning: put in untested,
    # as hasten's Trainer does without an evaluation set) and so does hasten's
    x, y = _data()
    a, b = _mlp(), _mlp()
    _lightning(Module(a), _loader(x, y), [EMA(decay=0.9)], steps=8)
    Trainer(b, _loader(x, y), optimizers=torch.optim.SGD(b.parameters(), lr=0.1), max_duration="8ba",
            algorithms=[EMA(decay=0.9)]).fit(summary=False)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


def test_lightning_label_smoothing_is_pytorchs_label_smoothed_cross_entropy():
    x, y = _data()
    m = Module(_mlp())
    _lightning(m, _loader(x, y), [LabelSmoothing(0.1)], steps=4)
    assert len(m.seen) == 4
    for s in m.seen:
        torch.testing.assert_close(s["loss"], s["smoothed"], rtol=1e-6, atol=1e-6)
    assert m.loss_fn is F.cross_entropy   # the module's own loss is back after fit


def test_lightning_gradient_clipping_and_surgery_before_the_optimizers():
    x, y = _data()
    m = Module(_mlp(), lr=1.0)
    _lightning(m, _loader(x * 50, y), [GradientClipping("norm", 0.05), ActivationSwap("relu", "gelu")], steps=3)
    assert isinstance(m.net[1], torch.nn.GELU)
    assert all(s["grad_norm"] <= 0.05 * (1 + 1e-5) for s in m.seen)


def test_lightning_progressive_resizing_changes_the_batch_the_module_sees():
    torch.manual_seed(0)
    x, y = torch.randn(32, 3, 16, 16), torch.randint(0, 3, (32,))
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(4, 3))
    m = _Seeing(net)
    _lightning(m, _loader(x, y, 8), [ProgressiveResizing(initial_scale=0.5, finish=1.0, size_increment=4),
                                     ChannelsLast()], steps=4)
    # by hand: step s of 4 has scale 0.5 + 0.5 * s / 4 = 0.5, 0.625, 0.75, 0.875 of 16 pixels = 8, 10, 12, 14,
    # each side rounded to a multiple of 4 (Python's round: 10 -> 8, 14 -> 16)
    sides = [8, 8, 12, 16]
    for step, (s, side) in enumerate(zip(m.seen, sides)):
        batch = x[8 * step:8 * (step + 1)]
        want = batch if side == 16 else F.interpolate(batch, size=(side, side), mode="area")   # torch's own resize
        assert s["x"].shape == (8, 3, side, side) and torch.allclose(s["x"], want, atol=1e-6), step
        assert s["x"].is_contiguous(memory_format=torch.channels_last)


class _Seeing(Module):
    """Records the inputs, targets and logits of each training step beside the loss."""

    def training_step(self, batch, i):
        x, y = batch
        logits = self(x)
        loss = self.loss_fn(logits, y)
        self.seen.append({"x": x.detach().clone(), "logits": logits.detach().clone(), "loss": loss.detach()})
        return loss


def test_lightning_mixup_mixes_inputs_and_targets_through_the_loss_fn():
    """Each batch is the identity matrix, so a mixed batch shows its weight and partner in every row:
    row i is lam at column i and 1 - lam at column perm[i]. The loss the module computes must be
    lam * CE(logits, y) + (1 - lam) * CE(logits, y[perm]), recomputed here with F.cross_entropy."""
    steps, n = 3, 8
    x = torch.eye(n).repeat(steps, 1)
    y = torch.randint(0, 3, (steps * n,), generator=torch.Generator().manual_seed(1))
    m = _Seeing(_mlp())
    _lightning(m, _loader(x, y, n), [MixUp(alpha=1.0)], steps=steps)
    assert len(m.seen) == steps
    mixed_steps = 0
    for step, s in enumerate(m.seen):
        xs, ys = s["x"], y[step * n:(step + 1) * n]
        others = [[j for j in range(n) if j != i and xs[i, j] > 1e-9] for i in range(n)]
        perm = torch.tensor([o[0] if o else i for i, o in enumerate(others)])
        lam = float(xs[[i for i in range(n) if others[i]], [i for i in range(n) if others[i]]].mean())
        assert torch.allclose(xs, lam * torch.eye(n) + (1 - lam) * torch.eye(n)[perm], atol=1e-6)
        want = lam * F.cross_entropy(s["logits"], ys) + (1 - lam) * F.cross_entropy(s["logits"], ys[perm])
        assert torch.allclose(s["loss"], want, atol=1e-6), (step, s["loss"], want)
        mixed_steps += 0.02 < lam < 0.98
    assert mixed_steps >= 2   # Beta(1, 1) draws: the batches were really mixed


# ---------------------------------------------------------------------------- HF Trainer: effects
_BERT = dict(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3, max_position_embeddings=16)


class _Dicts(Dataset):
    def __init__(self, **tensors):
        self.t = tensors

    def __len__(self):
        return len(next(iter(self.t.values())))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.t.items()}


def _args(tmp_path, steps, **kw):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=16, max_steps=steps, logging_steps=1,
        report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True, seed=0, **kw)


def test_hf_trainer_ema_and_label_smoothing_match_hastens_trainer(tmp_path):
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(**_BERT))
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    ids, labels = torch.randint(1, 50, (16, 12)), torch.randint(0, 3, (16,))   # one batch: every step sees it
    reference = F.cross_entropy(b(input_ids=ids).logits, labels, label_smoothing=0.1).item()
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    t = HastenTrainer(model=a, args=_args(tmp_path, 6, max_grad_norm=0.0), train_dataset=_Dicts(input_ids=ids, labels=labels),
                      algorithms=[EMA(decay=0.9), LabelSmoothing(0.1)],
                      optimizers=(opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)))
    t.train()
    assert t.state.log_history[0]["loss"] == pytest.approx(reference, rel=1e-6)
    Trainer(b, DataLoader(TensorDataset(ids, labels), batch_size=16), optimizers=torch.optim.SGD(b.parameters(), lr=0.1),
            max_duration="6ba", algorithms=[EMA(decay=0.9), LabelSmoothing(0.1)]).fit(summary=False)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5)


def test_hf_trainer_causal_lm_loss_is_shifted_and_reduced_as_the_hf_trainer_reduces(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    g = transformers.GPT2LMHeadModel(cfg)
    g0 = copy.deepcopy(g)
    ids = torch.randint(1, 50, (16, 12))
    t = HastenTrainer(model=g, args=_args(tmp_path, 2), train_dataset=_Dicts(input_ids=ids, labels=ids),
                      algorithms=[LabelSmoothing(0.1), SeqLenWarmup(start=4, step=4, duration="1.0dur")],
                      optimizers=(muon_optimizer(g, muon_lr=0.02, adam_lr=3e-3), None))
    t.train()
    # the first step trains on windows of 4 (the warm-up), the loss over the predicted tokens divided by
    # the label count, as the HF Trainer's own causal-LM loss divides
    w = ids.reshape(-1, 4)
    logits = g0(input_ids=w).logits[:, :-1]
    total = F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), label_smoothing=0.1, reduction="sum")
    assert t.state.log_history[0]["loss"] == pytest.approx((total / w.numel()).item(), rel=1e-5)
    assert t.state.log_history[1]["loss"] < t.state.log_history[0]["loss"] + 1.0


def test_combined_optimizer_steps_exactly_as_its_parts():
    a, b = _mlp(1), _mlp(1)
    parts = muon_optimizers(a, muon_lr=0.02, adam_lr=1e-3, exclude=("2.*",))
    combined = CombinedOptimizer(muon_optimizers(b, muon_lr=0.02, adam_lr=1e-3, exclude=("2.*",)))
    schedule = torch.optim.lr_scheduler.LambdaLR(combined, lambda s: 0.5 ** s)
    part_schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.5 ** s) for o in parts]
    x, y = _data()
    for _ in range(3):
        for model, step in ((a, lambda: [o.step() for o in parts]), (b, combined.step)):
            F.cross_entropy(model(x), y).backward()
            step()
        for o in parts:
            o.zero_grad()
        combined.zero_grad()
        schedule.step()
        for s in part_schedules:
            s.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    combined.load_state_dict(combined.state_dict())
    assert {g["lr"] for g in combined.param_groups} == {0.02 * 0.125, 1e-3 * 0.125}


def test_a_host_loop_marks_its_state_so_patch_whitening_keeps_the_graph():
    """Lightning or the HF Trainer may compile or wrap the model out of hasten's sight: patch
    whitening's bias must stop by dropping its gradient there, never by flipping requires_grad."""
    from hasten.algorithms import PatchWhitening
    from hasten.integrations.host import HostLoop
    from hasten.models import SpeedrunNet
    loop = HostLoop([ChannelsLast()], "Lightning")
    loop.setup(SpeedrunNet(widths=(8, 8, 8)))
    assert loop.state.host == "Lightning" and PatchWhitening.keeps_graph(loop.state)


def test_lightning_judges_the_average_on_the_hosts_validation_and_keeps_the_better_weights():
    """With validation running, EMA's average is compared with the trained weights by the
    module's loss_fn on the host's validation data at the last validation: an average far
    behind (decay 0.999 over 16 steps: mostly the initial weights) is not kept, and no warning
    says it went in untested."""
    import warnings

    class Validated(Module):
        def validation_step(self, batch, i):
            self.log("val_loss", self.loss_fn(self(batch[0]), batch[1]))

    x, y = _data()
    m = Validated(_mlp())
    cb = HastenCallback([EMA(decay=0.999)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, callbacks=[cb], num_sanity_val_steps=0).fit(m, _loader(x, y),
                                                                                            _loader(x, y))
    said = [str(w.message) for w in caught]
    assert not any("untested" in s for s in said), said
    assert any("the average evaluated worse than the trained weights" in s for s in said), said
    trained_loss = F.cross_entropy(m(x), y).item()
    assert trained_loss == pytest.approx(cb.host.state.eval_metrics["val/loss"], rel=1e-5)
