"""Model surgery, optimisation and augmentation methods, each against an independent reference."""
import copy
import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hasten.functional as hf
from hasten import Algorithm, Event, Trainer
from hasten.algorithms import (SAM, SWA, ActivationSwap, CutMix, DiracInit, FrozenBNScale, GhostBatchNormAlgorithm,
                               GradientClipping, Lookahead, MixUp, PoolReorder, ProgressiveResizing)
from hasten.optim import param_groups
from hasten.optim.sgdw import SGDW, decoupled_hparams

from tiny import classification_data, mlp, model_and_twin


def _conv_net():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(8 * 2 * 2, 4))


def _img_batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def _grab_grads():
    out = {}

    class Grab(Algorithm):
        def before_optim_step(self, state, logger):
            out["grads"] = [p.grad.clone() for p in state.model.parameters()]
    return Grab(), out


# ---------------------------------------------------------------------------- surgery
def test_dirac_init_passes_input_through():
    conv = nn.Conv2d(4, 6, 3, padding=1, bias=False)
    hf.dirac_init_(conv)
    x = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(conv(x)[:, :4], x)
    model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 2))
    Trainer(model, [(x, x)], device="cpu", algorithms=[DiracInit()], max_duration="1ba", loss_fn=F.mse_loss)
    assert torch.equal(model[0].weight[:, :, 1, 1], torch.eye(4))   # odd kernel: identity; even kernel untouched


def test_pool_reorder_keeps_the_function_for_monotone_layers():
    torch.manual_seed(0)
    a = _conv_net()
    for m in a.modules():   # non-trivial BN with positive scale
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2), m.weight.data.uniform_(0.5, 2)
    b = _conv_net()
    b.load_state_dict(a.state_dict())
    assert hf.reorder_pools(b) == 2
    assert isinstance(b[1], nn.MaxPool2d) and isinstance(b[2], nn.BatchNorm2d)
    x, _ = _img_batch()
    torch.testing.assert_close(a.eval()(x), b.eval()(x), rtol=1e-5, atol=1e-6)
    assert PoolReorder.listens_to() == (Event.INIT,)


def test_pool_reorder_reaches_resnet9_pools_nested_one_level_down_and_refuses_a_model_without_any():
    from hasten.models import MODELS
    torch.manual_seed(0)
    a = MODELS["resnet9"](width=4)
    for m in a.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2), m.weight.data.uniform_(0.5, 2)
    b = MODELS["resnet9"](width=4)
    b.load_state_dict(a.state_dict())
    assert hf.reorder_pools(b) == 3   # layer1, layer2, layer3: Sequential(conv_bn, MaxPool2d, ...)
    assert isinstance(b.layer1[0][1], nn.MaxPool2d) and isinstance(b.layer1[1], nn.Identity)
    x, _ = _img_batch()
    torch.testing.assert_close(a.eval()(x), b.eval()(x), rtol=1e-5, atol=1e-6)
    assert hf.reorder_pools(b) == 0   # nothing left to move
    with pytest.raises(ValueError, match="pool_reorder: the model has no conv"):
        Trainer(MODELS["speedrun"](widths=(8, 16, 16)), [_img_batch()], device="cpu", algorithms=[PoolReorder()],
                max_duration="1ba")


def test_activation_swap_replaces_modules_and_the_optimizer_sees_the_new_model():
    model = _conv_net()
    x, y = _img_batch()
    tr = Trainer(model, [(x, y)], device="cpu", algorithms=[ActivationSwap("relu", "celu")], max_duration="1ba",
                 optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
    assert not any(isinstance(m, nn.ReLU) for m in model.modules())
    assert sum(isinstance(m, nn.CELU) for m in model.modules()) == 2
    tr.fit()
    with pytest.raises(ValueError, match="no relu"):
        Trainer(nn.Sequential(nn.Linear(2, 2)), device="cpu", algorithms=[ActivationSwap("relu", "gelu")])


def test_ghost_batchnorm_equals_batch_norm_chunk_by_chunk():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(5, momentum=0.2)
    nn.init.uniform_(bn.weight), nn.init.uniform_(bn.bias)
    ref = nn.BatchNorm2d(5, momentum=0.2)
    ref.load_state_dict(bn.state_dict())
    x = torch.randn(32, 5, 4, 4) * 3 + 1
    out = hf.ghost_batch_norm(x, bn.train(), 8)
    want = torch.cat([F.batch_norm(c, ref.running_mean, ref.running_var, ref.weight, ref.bias, True, 0.2, ref.eps)
                      for c in x.split(8)])
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    assert not torch.allclose(out, F.batch_norm(x, None, None, bn.weight, bn.bias, True))  # not plain BN
    model = _conv_net()
    Trainer(model, [(x[:, :3], torch.zeros(32, dtype=torch.long))], device="cpu",
            algorithms=[GhostBatchNormAlgorithm(8)], max_duration="1ba")
    assert sum(type(m).__name__ == "GhostBatchNorm" for m in model.modules()) == 2


def test_frozen_bn_scale_with_bias_lr_multiplier():
    model = _conv_net()
    tr = Trainer(model, [_img_batch()], device="cpu", algorithms=[FrozenBNScale(1.0, bias_lr_mult=64)],
                 max_duration="2ba", optimizers=lambda m: torch.optim.SGD(param_groups(m, 5e-4), lr=0.01))
    from hasten.optim import apply_lr_multipliers
    apply_lr_multipliers(tr.state.optimizers[0])
    tr.fit()
    assert torch.equal(model[1].weight, torch.ones(8)) and not model[1].weight.requires_grad
    lrs = {id(p): g["lr"] for g in tr.state.optimizers[0].param_groups for p in g["params"]}
    assert lrs[id(model[1].bias)] == pytest.approx(0.64) and lrs[id(model[0].bias)] == pytest.approx(0.01)


def test_decay_ignores_lr_mult_keeps_the_decay_per_step():
    # With zero gradients an SGD step only decays: w <- w (1 - lr_group * wd_group). A bias at 64x
    # the lr must then shrink by the same factor as the weights, 1 - lr * wd.
    model = nn.Linear(4, 3)
    model.bias.lr_mult = 64.0
    from hasten.optim import apply_lr_multipliers
    opt = apply_lr_multipliers(torch.optim.SGD(
        param_groups(model, 1e-2, decay_min_dim=1, decay_ignores_lr_mult=True), lr=0.5))
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for p, b in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach(), b * (1 - 0.5 * 1e-2))
    coupled = {g["name"]: g["weight_decay"] for g in param_groups(model, 1e-2, decay_min_dim=1)}
    assert coupled == {"decay": 1e-2, "decay_lr64": 1e-2}


# ---------------------------------------------------------------------------- optimisation
def test_sgdw_decays_outside_momentum():
    torch.manual_seed(0)
    w0 = torch.randn(5)
    grads = [torch.randn(5) for _ in range(4)]
    p = nn.Parameter(w0.clone())
    opt = SGDW([p], lr=0.1, momentum=0.9, weight_decay=0.05, nesterov=True)
    w, buf = w0.clone(), None          # reference: decay, then Nesterov SGD on the bare gradient
    for g in grads:
        p.grad = g.clone()
        opt.step()
        w = w * (1 - 0.1 * 0.05)
        buf = g.clone() if buf is None else 0.9 * buf + g
        w = w - 0.1 * (g + 0.9 * buf)
    torch.testing.assert_close(p.detach(), w)


def test_decoupled_hparams_are_independent_of_momentum_and_batch_size():
    # the steady-state step per example and the shrink per example stay the same
    for m, b in ((0.0, 128), (0.9, 512), (0.85, 1024)):
        h = decoupled_hparams(lr=1e-3, weight_decay=1e-6, momentum=m, batch_size=b)
        assert h["lr"] / (1 - m) / b == pytest.approx(1e-3)
        assert h["lr"] * h["weight_decay"] / b == pytest.approx(1e-6)


def test_lookahead_matches_a_hand_loop():
    x, y = classification_data(n=16)
    model, ref = model_and_twin()
    Trainer(model, [(x, y)] * 7, device="cpu", max_duration="7ba", algorithms=[Lookahead(k=3, alpha=0.5)],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1)).fit()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    slow = [p.detach().clone() for p in ref.parameters()]
    for step in range(1, 8):
        F.cross_entropy(ref(x), y).backward()
        opt.step()
        opt.zero_grad()
        if step % 3 == 0:
            with torch.no_grad():
                for s, p in zip(slow, ref.parameters()):
                    s += 0.5 * (p - s)
                    p.copy_(s)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)


def test_lookahead_ramp_and_buffers_match_a_hand_loop():
    # ramp=3: a sync at progress t pulls with alpha_t = 1 - (1 - alpha) t^3; buffers=True also
    # averages the batch-norm running statistics. Reference: a hand loop that does both.
    torch.manual_seed(0)
    make = lambda: nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    model, ref = model_and_twin(make)
    x, y = classification_data(n=16)
    steps, k, alpha = 8, 2, 0.25
    Trainer(model, [(x, y)] * steps, device="cpu", max_duration=f"{steps}ba",
            algorithms=[Lookahead(k=k, alpha=alpha, ramp=3, buffers=True)],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1)).fit()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    tensors = lambda: [*ref.parameters(), ref[1].running_mean, ref[1].running_var]
    slow = [t.detach().clone() for t in tensors()]
    for step in range(1, steps + 1):
        F.cross_entropy(ref(x), y).backward()
        opt.step()
        opt.zero_grad()
        if step % k == 0:
            a = 1 - (1 - alpha) * (step / steps) ** 3
            with torch.no_grad():
                for s, t in zip(slow, tensors()):
                    s.mul_(1 - a).add_(a * t)
                    t.copy_(s)
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        torch.testing.assert_close(a, b)
    assert Lookahead(alpha=0.25, ramp=3).alpha_at(0.0) == 1.0
    assert Lookahead(alpha=0.25, ramp=3).alpha_at(1.0) == pytest.approx(0.25)


def test_sam_gradient_matches_the_two_pass_definition():
    x, y = classification_data(n=16)
    model, ref = model_and_twin()
    init = [p.detach().clone() for p in model.parameters()]
    grab, out = _grab_grads()
    tr = Trainer(model, [(x, y)], device="cpu", max_duration="1ba", algorithms=[SAM(rho=0.1), grab],
                 optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.0))
    tr.fit()
    params = list(ref.parameters())
    g = torch.autograd.grad(F.cross_entropy(ref(x), y), params)
    norm = torch.sqrt(sum((t ** 2).sum() for t in g))
    with torch.no_grad():
        for p, t in zip(params, g):
            p += 0.1 * t / norm
    g2 = torch.autograd.grad(F.cross_entropy(ref(x), y), params)
    for a, b in zip(out["grads"], g2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for p, q in zip(tr.state.model.parameters(), init):   # back at the weights (lr 0)
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize("which", ["both", "first"])
def test_sam_running_stats_come_from_the_chosen_pass(which):
    x, y = classification_data(n=32)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(x.shape[1], 16), nn.BatchNorm1d(16, momentum=0.5), nn.ReLU(), nn.Linear(16, 4))
    ref = copy.deepcopy(model)
    Trainer(model, [(x, y)], device="cpu", max_duration="1ba", algorithms=[SAM(rho=0.5, running_stats=which)],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.0)).fit()
    # the reference: torch's own batch norm fed the batch at w, then (for "both") at the perturbed weights
    params = list(ref.parameters())
    g = torch.autograd.grad(F.cross_entropy(ref(x), y), params)
    if which == "both":
        norm = torch.sqrt(sum((t ** 2).sum() for t in g))
        with torch.no_grad():
            for p, t in zip(params, g):
                p += 0.5 * t / norm
            ref(x)
    bn, bn_ref = model[1], ref[1]
    torch.testing.assert_close(bn.running_mean, bn_ref.running_mean)
    torch.testing.assert_close(bn.running_var, bn_ref.running_var)
    assert int(bn.num_batches_tracked) == int(bn_ref.num_batches_tracked) == (2 if which == "both" else 1)


def test_sam_refuses_an_unknown_running_stats_choice():
    with pytest.raises(ValueError, match="running_stats must be one of"):
        SAM(running_stats="second")


def test_adaptive_clipping_matches_a_row_by_row_reference():
    torch.manual_seed(0)
    lin = nn.Linear(6, 4)
    lin.weight.grad = torch.randn(4, 6) * 10
    lin.bias.grad = torch.randn(4) * 10
    w, g, gb = lin.weight.detach().clone(), lin.weight.grad.clone(), lin.bias.grad.clone()
    hf.adaptive_clip_grad_(lin.parameters(), clip=0.05)
    for i in range(4):
        limit = 0.05 * max(w[i].norm().item(), 1e-3)
        want = g[i] * min(1.0, limit / g[i].norm().item())
        torch.testing.assert_close(lin.weight.grad[i], want)
    assert torch.equal(lin.bias.grad, gb)   # vectors untouched


@pytest.mark.parametrize("mode,check", [
    ("norm", lambda gs: torch.sqrt(sum((g ** 2).sum() for g in gs)).item() <= 0.01 + 1e-6),
    ("value", lambda gs: max(g.abs().max().item() for g in gs) <= 0.01 + 1e-9)])
def test_gradient_clipping_modes(mode, check):
    x, y = classification_data(n=16)
    grab, out = _grab_grads()
    Trainer(mlp(), [(x, y)], device="cpu", max_duration="1ba",
            algorithms=[GradientClipping(mode, 0.01), grab]).fit()
    assert check(out["grads"])


def test_swa_average_matches_a_hand_average():
    x, y = classification_data(n=16)
    torch.manual_seed(0)
    model = mlp()
    snaps = []

    class Snap(Algorithm):
        def batch_end(self, state, logger):
            if state.progress > 0.5:
                snaps.append([p.detach().clone() for p in state.model.parameters()])

    Trainer(model, [(x, y)] * 8, device="cpu", max_duration="8ba", algorithms=[SWA(start=0.5), Snap()],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1)).fit()
    assert len(snaps) == 4
    for i, p in enumerate(model.parameters()):
        torch.testing.assert_close(p, torch.stack([s[i] for s in snaps]).mean(0))


def test_swa_evaluations_measure_the_averaged_model_and_training_resumes_from_the_trained_one():
    """The run's last evaluation (due at the last batch) once measured the un-averaged model,
    since the average went in only at fit_end. Now an evaluation in the window swaps the
    average (and its batch-norm statistics) in and the trained weights back out: the final
    metrics are those of the model fit leaves, and training after a mid-window evaluation is
    untouched by it."""
    from tiny import model_and_twin
    x, y = classification_data(n=64)
    data = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]

    def net():
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                   torch.nn.Linear(16, 4))

    def run(model, eval_interval):
        tr = Trainer(model, data, device="cpu", max_duration="12ba", eval_dataloader=data[:2],
                     eval_interval=eval_interval, algorithms=[SWA(start=0.5, bn_batches=4)],
                     optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9))
        tr.fit()
        return tr
    model, twin = model_and_twin(net)
    often, rarely = run(model, "3ba"), run(twin, "12ba")   # evaluations at 3, 6 and 9 inside the window
    assert often.state.eval_metrics == often.evaluate(data[:2])   # the last evaluation saw the final model
    for a, b in zip(model.state_dict().values(), twin.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)        # mid-window evaluations changed no training
    assert rarely.state.eval_metrics == rarely.evaluate(data[:2])


# ---------------------------------------------------------------------------- augmentation
def test_mixup_loss_is_the_mixture_of_the_two_labels():
    x, y = classification_data(n=16)
    seen = {}

    class Spy(Algorithm):   # runs after MixUp on AFTER_DATALOADER, before it on AFTER_LOSS (reversed)
        def after_loss(self, state, logger):
            seen["loss"], seen["outputs"], seen["x"] = state.loss.detach(), state.outputs.detach(), state.micro_batch[0]

    mix = MixUp(alpha=0.4)
    Trainer(mlp(), [(x, y)], device="cpu", max_duration="1ba", algorithms=[mix, Spy()]).fit()
    rng = random.Random(__import__("hasten.seeding", fromlist=["derive_seed"]).derive_seed(0, 0, 11))
    rng.random()
    lam = rng.betavariate(0.4, 0.4)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(
        __import__("hasten.seeding", fromlist=["derive_seed"]).derive_seed(0, 0, 11)))
    torch.testing.assert_close(seen["x"], lam * x + (1 - lam) * x[perm])
    out = seen["outputs"]
    want = lam * F.cross_entropy(out, y, reduction="none") + (1 - lam) * F.cross_entropy(out, y[perm], reduction="none")
    torch.testing.assert_close(seen["loss"], want)


def test_cutmix_box_area_sets_the_label_weight():
    x = torch.arange(2 * 1 * 8 * 8, dtype=torch.float32).view(2, 1, 8, 8)
    perm = torch.tensor([1, 0])
    box = (2, 6, 1, 5)
    out, lam = hf.cutmix_batch(x, perm, box)
    assert lam == pytest.approx(1 - 16 / 64)
    assert torch.equal(out[0, :, 2:6, 1:5], x[1, :, 2:6, 1:5]) and torch.equal(out[0, :, 0, :], x[0, :, 0, :])
    t, b, l, r = hf.cutmix_box(32, 32, 0.75, random.Random(0))
    assert 0 <= t < b <= 32 and 0 <= l < r <= 32
    x, y = _img_batch(16)
    Trainer(_conv_net(), [(x, y)], device="cpu", max_duration="1ba", algorithms=[CutMix()]).fit()


def test_progressive_resizing_scales_early_batches_and_evaluates_full_size():
    assert hf.resize_scale(0.0, 0.5, 0.0, 0.6) == 0.5 and hf.resize_scale(0.7, 0.5, 0.0, 0.6) == 1.0
    x = torch.randn(2, 3, 32, 32)
    small = hf.resize_batch(x, 0.5)
    assert small.shape[-2:] == (16, 16)
    torch.testing.assert_close(small, F.avg_pool2d(x, 2))   # area downscaling by 2 is 2x2 averaging
    sizes = []

    class Spy(Algorithm):
        def before_forward(self, state, logger):
            sizes.append(state.micro_batch[0].shape[-1])

    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 4))
    xb, yb = torch.randn(4, 3, 32, 32), torch.zeros(4, dtype=torch.long)
    Trainer(model, [(xb, yb)] * 10, device="cpu", max_duration="10ba",
            algorithms=[ProgressiveResizing(0.5, 0.0, 0.6), Spy()]).fit()
    assert sizes[0] == 16 and sizes[-1] == 32 and sizes == sorted(sizes)


# ---------------------------------------------------------------------------- anti-aliasing, depth, freezing
def test_blur_is_the_separable_121_filter():
    x = torch.randn(2, 3, 6, 6)
    p = F.pad(x, (1, 1, 1, 1), mode="reflect")
    rows = (p[..., :-2, :] + 2 * p[..., 1:-1, :] + p[..., 2:, :]) / 4
    want = (rows[..., :-2] + 2 * rows[..., 1:-1] + rows[..., 2:]) / 4
    torch.testing.assert_close(hf.blur2d(x, 1), want)
    torch.testing.assert_close(hf.blur2d(x, 2), want[..., ::2, ::2])
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, stride=2, padding=1))
    assert hf.apply_blurpool(model) == 2
    assert model(torch.randn(1, 3, 16, 16)).shape == (1, 16, 4, 4)


def test_stochastic_depth_keeps_the_expectation_and_eval_is_exact():
    from hasten.algorithms import StochasticDepth
    from hasten.models import resnet18
    y = torch.ones(20000, 3)
    out = hf.drop_path(y, 0.3, torch.Generator().manual_seed(0))
    vals = out[:, 0].unique()
    assert len(vals) == 2 and vals[0] == 0 and vals[1].item() == pytest.approx(1 / 0.7)
    assert out.mean().item() == pytest.approx(1.0, abs=0.02)
    torch.manual_seed(0)
    model = resnet18(10, "cifar", width=8)
    ref = resnet18(10, "cifar", width=8)
    ref.load_state_dict(model.state_dict())
    Trainer(model, [_img_batch(4)], device="cpu", algorithms=[StochasticDepth(0.5)], max_duration="1ba")
    rates = [m.p for m in model.modules() if type(m).__name__ == "DropPath"]
    assert len(rates) == 8 and rates[-1] == pytest.approx(0.5) and rates == sorted(rates)
    x, _ = _img_batch(4)
    torch.testing.assert_close(model.eval()(x), ref.eval()(x))


def test_layer_freezing_freezes_the_first_tensors_progressively():
    from hasten.algorithms import LayerFreezing
    x, y = classification_data(n=16)
    model = mlp()
    first_w = model[0].weight.detach().clone()
    Trainer(model, [(x, y)] * 10, device="cpu", max_duration="10ba", algorithms=[LayerFreezing(0.0, 0.75)],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1)).fit()
    assert not model[0].weight.requires_grad and not model[0].bias.requires_grad
    assert model[2].weight.requires_grad
    assert not torch.equal(model[0].weight, first_w)   # it trained before being frozen


def test_layer_freezing_without_a_ramp_freezes_the_whole_share_at_start():
    from hasten import Callback
    from hasten.algorithms import LayerFreezing
    x, y = classification_data(n=16)
    model = mlp()   # 4 tensors: the first layer's weight and bias, then the second's
    seen = []

    class Watch(Callback):
        def batch_end(self, state, logger):
            seen.append(sum(not p.requires_grad for p in state.model.parameters()))

    Trainer(model, [(x, y)] * 10, device="cpu", max_duration="10ba",
            algorithms=[LayerFreezing("5ba", 0.5, ramp=False)], callbacks=[Watch()],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1)).fit()
    assert seen == [0] * 5 + [2] * 5, seen   # none for 5 batches, then both first-layer tensors at once
    with pytest.raises(TypeError, match="ramp must be"):
        LayerFreezing(0.5, 0.5, ramp="no")


def test_layer_freezing_freezes_again_after_a_resume(tmp_path):
    # requires_grad is not checkpointed: a resumed run must freeze its fresh model's first tensors
    from hasten.algorithms import LayerFreezing
    x, y = classification_data(n=16)
    first = Trainer(mlp(), [(x, y)] * 10, device="cpu", max_duration="6ba", save_folder=str(tmp_path),
                    algorithms=[LayerFreezing("2ba", 0.5, ramp=False)],
                    optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
    first.fit()
    fresh = mlp()
    assert all(p.requires_grad for p in fresh.parameters())
    Trainer(fresh, [(x, y)] * 10, device="cpu", max_duration="8ba", load_path=first.state.last_checkpoint,
            algorithms=[LayerFreezing("2ba", 0.5, ramp=False)],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1)).fit()
    assert [p.requires_grad for p in fresh.parameters()] == [False, False, True, True]
    for a, b in zip(fresh.parameters(), first.state.model.parameters()):
        if not a.requires_grad:
            torch.testing.assert_close(a, b)   # frozen since batch 2: the resumed run did not move them


# ---------------------------------------------------------------------------- models
def test_resnet_sizes_match_the_published_counts():
    from hasten.models import resnet18, resnet50
    count = lambda m: sum(p.numel() for p in m.parameters())   # noqa: E731
    assert count(resnet18()) == 11_689_512 and count(resnet50()) == 25_557_032   # torchvision's counts
    assert count(resnet18(10, "cifar")) == 11_173_962
    assert resnet50(10, "cifar", width=8)(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("mixer", ["mixup", "cutmix"])
def test_a_mixed_batch_split_into_micro_batches_keeps_each_sample_with_its_partner(mixer):
    """grad_accum=2 gives the step of grad_accum=1: the partner targets travel in the batch
    (before, the whole batch's partners were paired with a micro-batch's outputs and failed)."""
    x, y = _img_batch(16)
    weights = []
    for k in (1, 2):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 4))  # no BN
        algo = MixUp(alpha=0.4) if mixer == "mixup" else CutMix()
        Trainer(model, [(x, y)], device="cpu", max_duration="1ba", grad_accum=k, algorithms=[algo],
                optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.5)).fit()
        weights.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*weights):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_swa_resumes_from_the_averagedmodel_state_of_older_checkpoints():
    """hasten 0.1 stored SWA's average as an AveragedModel's state dict; such a checkpoint
    resumes into the tensor-list average with the same values and count."""
    from types import SimpleNamespace

    from torch.optim.swa_utils import AveragedModel
    torch.manual_seed(0)
    model = mlp()
    old = AveragedModel(model, use_buffers=False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    old.update_parameters(model)
    swa = SWA(start=0.5)
    swa.load_state_dict({"averaged": old.state_dict()})
    swa._restore_pending(SimpleNamespace(model=model))
    assert swa.n_averaged == int(old.n_averaged) == 1
    for a, b in zip(swa.averaged, old.module.parameters()):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("call, needle", [
    (lambda x, y: hf.smooth_labels(y, 4, 1.5), "smoothing must lie in"),
    (lambda x, y: hf.smoothed_cross_entropy(torch.randn(8, 4), y, -0.1), "smoothing must lie in"),
    (lambda x, y: hf.drop_path(x, 1.0), "p must lie below 1"),
    (lambda x, y: hf.resize_batch(x, 0.0), "need scale > 0"),
    (lambda x, y: hf.mixup_batch(x, y, 1.5, torch.randperm(8)), "lam .* must lie in"),
    (lambda x, y: hf.freeze_first(nn.Linear(2, 2), 2.0), "freeze_first: fraction"),
    (lambda x, y: hf.random_translate(x, 8), "a reflection of 8 px needs images larger"),
])
def test_a_functional_form_refuses_what_its_algorithm_refuses(call, needle):
    """Used in a plain loop, a functional form checks its arguments as its Algorithm does:
    these returned wrong numbers (negative target mass, inf from 1 / (1 - p), a silent clamp)
    or failed deep in an index error before."""
    x, y = _img_batch()
    with pytest.raises(ValueError, match=needle):
        call(x, y)


def test_a_translation_by_as_much_as_the_image_works_where_the_mode_allows_it():
    x, _ = _img_batch()
    out = hf.random_translate(x, 8, mode="constant")
    assert out.shape == x.shape
