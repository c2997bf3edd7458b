"""On-device augmentation, the DeviceLoader, and the vision methods, against independent references."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hasten
import hasten.functional as hf
from hasten import Trainer
from hasten.algorithms import TTA, ChannelsLast, LabelSmoothing, PatchWhitening
from hasten.data import DeviceLoader
from hasten.models import SpeedrunNet


def _images(n=6, c=3, h=8, w=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, h, w, generator=g)


# ---------------------------------------------------------------------------- augmentations
@pytest.mark.parametrize("mode", ["reflect", "constant", "replicate"])
def test_translate_equals_pad_then_crop(mode):
    x = _images()
    pad = 2
    g = torch.Generator().manual_seed(1)
    dy, dx = torch.randint(-pad, pad + 1, (2, len(x)), generator=g)
    flip = torch.tensor([True, False, True, False, False, True])
    out = hf.translate(x, dy, dx, pad, mode, flip=flip)
    for i in range(len(x)):   # reference: pad one image, crop its window, mirror it
        p = F.pad(x[i:i + 1], (pad,) * 4, mode=mode)[0]
        want = p[:, pad + dy[i]:pad + dy[i] + 8, pad + dx[i]:pad + dx[i] + 8]
        if flip[i]:
            want = want.flip(-1)
        torch.testing.assert_close(out[i], want, rtol=0, atol=0)


def test_translate_works_on_uint8_and_keeps_channels_last():
    x = (torch.rand(4, 3, 8, 8) * 255).to(torch.uint8)
    d = torch.tensor([1, -2, 0, 2])
    ref = hf.translate(x.float(), d, -d, 2)
    torch.testing.assert_close(hf.translate(x, d, -d, 2).float(), ref)
    cl = _images(4).contiguous(memory_format=torch.channels_last)
    assert hf.random_translate(cl, 2).is_contiguous(memory_format=torch.channels_last)


def test_cutout_zeroes_one_square_per_image():
    x = torch.ones(64, 1, 16, 16)
    out = hf.cutout(x, 4, torch.Generator().manual_seed(0))
    zeros = (out == 0).sum(dim=(1, 2, 3))
    assert zeros.max() == 16 and zeros.min() >= 4   # a full 4x4 square, or clipped at a border
    for img in out[:, 0]:                           # the zeros form one axis-aligned rectangle
        rows, cols = torch.nonzero(img == 0, as_tuple=True)
        assert (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1) == len(rows)


def test_alternating_flip_flips_each_image_in_every_other_epoch():
    x = _images(8)
    idx = torch.arange(8)
    first = torch.tensor([0, 1, 0, 1, 1, 1, 0, 0], dtype=torch.bool)
    e0, e1, e2 = (hf.alternating_flip(x, idx, e, first) for e in range(3))
    for i in range(8):
        flipped = [not torch.equal(e[i], x[i]) for e in (e0, e1, e2)]
        assert flipped == [bool(first[i]), not first[i], bool(first[i])]


def _per_image_line(before, after):
    """Least-squares fit after[i] = slope[i] * before[i] + intercept[i] over each image's pixels."""
    b, a = before.flatten(1).double(), after.flatten(1).double()
    bc, ac = b - b.mean(1, keepdim=True), a - a.mean(1, keepdim=True)
    slope = (bc * ac).sum(1) / (bc * bc).sum(1)
    return slope, a.mean(1) - slope * b.mean(1)


def test_brightness_contrast_is_one_shift_then_one_scale_per_image_within_the_bounds():
    x = _images(400)
    out = hf.random_brightness_contrast(x, 0.3, 0.2, torch.Generator().manual_seed(0))
    slope, intercept = _per_image_line(x, out)
    resid = out.double() - (slope.view(-1, 1, 1, 1) * x.double() + intercept.view(-1, 1, 1, 1))
    assert resid.abs().max() < 1e-5                       # every pixel of an image moved by one affine map
    assert slope.min() >= 0.8 and slope.max() <= 1.2      # contrast scale in [1 - 0.2, 1 + 0.2]
    shift = intercept / slope
    assert shift.abs().max() <= 0.3 + 1e-6                # brightness shift in [-0.3, 0.3], before the scale
    assert slope.min() < 0.85 and slope.max() > 1.15 and shift.min() < -0.25 and shift.max() > 0.25   # the range is used
    assert hf.random_brightness_contrast(x, 0.0, 0.0) is x
    with pytest.raises(ValueError, match="contrast"):
        hf.random_brightness_contrast(x, 0.1, 1.0)
    bf = hf.random_brightness_contrast(x.to(torch.bfloat16).contiguous(memory_format=torch.channels_last), 0.1, 0.1)
    assert bf.dtype == torch.bfloat16 and bf.is_contiguous(memory_format=torch.channels_last)


# ---------------------------------------------------------------------------- DeviceLoader
def _uint8_data(n=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 8, 8, 3), dtype=torch.uint8, generator=g), torch.arange(n) % 10


def test_device_loader_visits_every_sample_once_and_resumes_exactly():
    x, y = _uint8_data()
    L = DeviceLoader(x, y, 16, translate=2, flip="random", cutout=3, seed=3, with_indices=True)
    epoch = list(L.iter_epoch(4))
    assert len(epoch) == len(L) == 4
    seen = torch.cat([b[2] for b in epoch])
    assert sorted(seen.tolist()) == list(range(50))
    again = list(L.iter_epoch(4, skip_batches=2))
    for a, b in zip(epoch[2:], again):
        torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    other = torch.cat([b[2] for b in L.iter_epoch(5)])
    assert not torch.equal(seen, other)
    for xb, yb, ib in epoch:   # labels follow their images
        assert torch.equal(yb, y[ib])


def test_device_loader_normalises_like_the_host_transform():
    from hasten.data.transforms import Normalize
    x, y = _uint8_data()
    mean, std = (120.0, 110.0, 100.0), (60.0, 61.0, 62.0)
    L = DeviceLoader(x, y, 50, mean=mean, std=std, shuffle=False, channels_last=True, dtype=torch.bfloat16)
    xb, yb = next(iter(L))
    assert xb.dtype == torch.bfloat16 and xb.is_contiguous(memory_format=torch.channels_last)
    ref = torch.stack([Normalize(mean, std)(img) for img in x])
    torch.testing.assert_close(xb.float(), ref, rtol=1e-2, atol=1e-2)


def test_device_loader_selector_and_shards():
    x, y = _uint8_data()

    class Half:
        count = 25

        def indices(self):
            return torch.arange(0, 50, 2)

    L = DeviceLoader(x, y, 10, with_indices=True)
    L.selector = Half()
    got = torch.cat([b[2] for b in L.iter_epoch(0)])
    assert len(L) == 3 and sorted(got.tolist()) == list(range(0, 50, 2))
    shards = [DeviceLoader(x, y, 10, with_indices=True, rank=r, world_size=2) for r in range(2)]
    parts = [torch.cat([b[2] for b in s.iter_epoch(1)]) for s in shards]
    assert len(parts[0]) == len(parts[1]) == 25 and not set(parts[0].tolist()) & set(parts[1].tolist())


def test_device_loader_brightness_and_contrast_leave_every_other_draw_as_it_was():
    x, y = _uint8_data()
    kw = dict(mean=(120.5,) * 3, std=(60.0,) * 3, translate=2, flip="random", seed=5)   # no pixel at the mean
    plain = list(DeviceLoader(x, y, 16, **kw).iter_epoch(2))
    shifted = list(DeviceLoader(x, y, 16, brightness=0.5, **kw).iter_epoch(2))
    both = list(DeviceLoader(x, y, 16, brightness=0.5, contrast=0.3, **kw).iter_epoch(2))
    for (p, yp), (s, ys), (b, _) in zip(plain, shifted, both):
        assert torch.equal(yp, ys)
        d = (s - p).flatten(1)                               # the same crops and flips, one shift per image
        torch.testing.assert_close(d, d[:, :1].expand_as(d), rtol=0, atol=1e-5)
        assert d[:, 0].abs().max() <= 0.5 and d[:, 0].abs().min() > 0
        slope, _ = _per_image_line(p, b)
        assert ((slope - 1).abs() <= 0.3 + 1e-6).all() and (slope - 1).abs().max() > 0.01
    cut = [DeviceLoader(x, y, 16, cutout=3, brightness=j, **kw) for j in (0.0, 0.5)]
    for (a, _), (b, _) in zip(cut[0].iter_epoch(1), cut[1].iter_epoch(1)):
        assert torch.equal(a == 0, b == 0)                   # the same squares cut out, after the shift


def test_device_loader_brightness_resumes_exactly_and_shards_are_slices_of_the_whole_batch():
    x, y = _uint8_data()
    kw = dict(translate=2, flip="alternate", brightness=0.2, contrast=0.2, seed=7)
    whole = list(DeviceLoader(x, y, 20, **kw).iter_epoch(3))
    again = list(DeviceLoader(x, y, 20, **kw).iter_epoch(3, skip_batches=1))
    torch.testing.assert_close(whole[1][0], again[0][0], rtol=0, atol=0)
    shares = [list(DeviceLoader(x, y, 20, rank=r, world_size=2, **kw).iter_epoch(3)) for r in range(2)]
    for k, (xb, _) in enumerate(whole):
        torch.testing.assert_close(torch.cat([shares[0][k][0], shares[1][k][0]]), xb, rtol=0, atol=0)
    with pytest.raises(ValueError, match="brightness"):
        DeviceLoader(x, y, 20, brightness=-0.1)


# ---------------------------------------------------------------------------- methods
def test_label_smoothing_matches_pytorch():
    logits = torch.randn(32, 10)
    y = torch.randint(0, 10, (32,))
    for a in (0.0, 0.1, 0.2):
        ref = F.cross_entropy(logits, y, label_smoothing=a, reduction="none")
        torch.testing.assert_close(hf.smoothed_cross_entropy(logits, y, a), ref)
        soft = hf.smooth_labels(y, 10, a)
        torch.testing.assert_close(soft.sum(1), torch.ones(32))
        torch.testing.assert_close(F.cross_entropy(logits, soft, reduction="none"), ref)


def test_label_smoothing_trains_smoothed_and_evaluates_plain():
    from tiny import loader, mlp
    from hasten import Algorithm
    from hasten.loss import default_loss
    seen = []

    class Spy(Algorithm):   # listed before LabelSmoothing: sees the per-sample training losses
        def after_loss(self, state, logger):
            x, y = state.micro_batch
            ref = F.cross_entropy(state.outputs, y, label_smoothing=0.3, reduction="none")
            seen.append(torch.allclose(state.loss, ref, atol=1e-6))

    tr = Trainer(mlp(), loader(), max_duration="2ba", eval_dataloader=loader(), device="cpu",
                 algorithms=[Spy(), LabelSmoothing(0.3)])
    tr.fit()
    assert seen == [True, True]
    assert tr.state.loss_fn is default_loss   # restored after fit
    plain = tr.evaluate()["val/loss"]
    model = tr.state.model.eval()
    ref = torch.cat([F.cross_entropy(model(x), y, reduction="none") for x, y in loader()]).mean()
    assert plain == pytest.approx(ref.item(), rel=1e-5)


def test_label_smoothing_alone_changes_what_the_trainer_optimises():
    # No other algorithm listens after the loss, so the Trainer could take its fused-mean fast
    # path; it must still train on the smoothed loss (a hand loop with PyTorch's own smoothing).
    from tiny import loader, model_and_twin
    model, twin = model_and_twin()
    tr = Trainer(model, loader(), optimizers=torch.optim.SGD(model.parameters(), lr=0.5),
                 max_duration="3ba", device="cpu", algorithms=[LabelSmoothing(0.3)])
    tr.fit()
    opt = torch.optim.SGD(twin.parameters(), lr=0.5)
    for (x, y), _ in zip(loader(), range(3)):
        F.cross_entropy(twin(x), y, label_smoothing=0.3).backward()
        opt.step()
        opt.zero_grad()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_patch_whitening_gives_identity_covariance():
    imgs = torch.randn(64, 3, 12, 12)
    imgs = imgs + 0.8 * imgs.roll(1, dims=-1) + torch.tensor([0.5, -1.0, 2.0]).view(1, 3, 1, 1)  # correlated
    conv = nn.Conv2d(3, 24, 2, bias=True)
    hf.fit_patch_whitening(conv, imgs, eps=1e-8)
    with torch.no_grad():
        out = conv(imgs)[:, :12].permute(0, 2, 3, 1).reshape(-1, 12).double()
    cov = torch.cov(out.T, correction=0)
    torch.testing.assert_close(cov, torch.eye(12, dtype=torch.float64), atol=1e-3, rtol=0)
    torch.testing.assert_close(out.mean(0), torch.zeros(12, dtype=torch.float64), atol=1e-4, rtol=0)


def test_patch_whitening_algorithm_fits_from_the_loader_and_freezes():
    x, y = _uint8_data(64)
    L = DeviceLoader(x, y, 16, mean=(128,) * 3, std=(64,) * 3)
    model = SpeedrunNet(widths=(8, 8, 8))
    tr = Trainer(model, L, max_duration="1ba", device="cpu", algorithms=[PatchWhitening(num_images=64)])
    assert not model.whiten.weight.requires_grad
    assert tr.state.method_seconds > 0
    with torch.no_grad():
        out = model.whiten((x.permute(0, 3, 1, 2).float() - 128) / 64)[:, :12]
    cov = torch.cov(out.permute(0, 2, 3, 1).reshape(-1, 12).T.double(), correction=0)
    assert torch.allclose(cov.diagonal(), torch.ones(12, dtype=torch.float64), atol=0.02)


def test_patch_whitening_bias_trains_for_the_stated_time_only():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 256, (64, 16, 16, 3), dtype=torch.uint8, generator=g), torch.arange(64) % 10
    L = DeviceLoader(x, y, 16, mean=(128,) * 3, std=(64,) * 3)
    model = SpeedrunNet(widths=(8, 8, 8))
    seen = []

    class Watch(hasten.Callback):
        def batch_end(self, state, logger):
            seen.append(model.whiten.bias.detach().clone())

    # momentum and weight decay would keep moving a bias whose gradient were only zeroed
    Trainer(model, L, max_duration="3ep", device="cpu", callbacks=[Watch()],
            optimizers=lambda m: torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1,
                                                 momentum=0.9, weight_decay=1e-2),
            algorithms=[PatchWhitening(num_images=64, train_bias_for="1ep")]).fit()
    moved = [not torch.equal(a, b) for a, b in zip(seen, seen[1:])]
    assert len(seen) == 12 and all(moved[:3]) and not any(moved[3:])   # 4 batches an epoch
    assert not model.whiten.bias.requires_grad   # eager, one process: the backward ends at the first group


def test_patch_whitening_bias_stops_the_same_whether_the_graph_keeps_its_shape_or_not(monkeypatch):
    """Compiled or distributed runs stop the bias by dropping its gradient (requires_grad stays);
    eager ones by requires_grad_(False). Every other parameter gets the same updates either way."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (64, 16, 16, 3), dtype=torch.uint8, generator=g), torch.arange(64) % 10

    def run(keep_graph: bool):
        monkeypatch.setattr(PatchWhitening, "keeps_graph", staticmethod(lambda state: keep_graph))
        torch.manual_seed(0)
        model = SpeedrunNet(widths=(8, 8, 8))
        Trainer(model, DeviceLoader(x, y, 16, mean=(128,) * 3, std=(64,) * 3), max_duration="2ep", device="cpu",
                optimizers=lambda m: torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1,
                                                     momentum=0.9, weight_decay=1e-2),
                algorithms=[PatchWhitening(num_images=64, train_bias_for="1ep")]).fit(summary=False)
        return model

    kept, eager = run(True), run(False)
    assert kept.whiten.bias.requires_grad and not eager.whiten.bias.requires_grad
    for (name, a), b in zip(kept.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    monkeypatch.undo()
    # which way a run takes: only hasten's Trainer running the model itself, in one process, flips requires_grad
    state = Trainer(SpeedrunNet(widths=(8, 8, 8)), DeviceLoader(x, y, 16), max_duration="1ba", device="cpu").state
    assert not PatchWhitening.keeps_graph(state)
    state.forward_model = nn.Sequential(state.model)            # a compiled or wrapped form of it
    assert PatchWhitening.keeps_graph(state)
    state.forward_model, state.host = state.model, "lightning"  # another trainer's loop may compile or wrap it
    assert PatchWhitening.keeps_graph(state)


@pytest.mark.slow
def test_a_compiled_speedrun_with_a_stopping_whitening_bias_and_partial_tta_compiles_nothing_when_timed():
    """The whitening bias stopping part-way and test-time augmentation of the least sure images
    (a batch of another size) are both compiled in the warm-up, not inside timed training."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 256, (48, 16, 16, 3), dtype=torch.uint8, generator=g), torch.arange(48) % 10
    train = DeviceLoader(x, y, 16, mean=(128,) * 3, std=(64,) * 3, drop_last=True)
    evals = DeviceLoader(x[:20], y[:20], 16, mean=(128,) * 3, std=(64,) * 3)   # 16, then 4
    torch.manual_seed(0)
    t = Trainer(SpeedrunNet(widths=(8, 8, 8)), train, eval_dataloader=evals, max_duration="4ep",
                eval_interval="2ep", compile=True, device="cpu",
                algorithms=[PatchWhitening(num_images=32, train_bias_for="1ep"), ChannelsLast(),
                            TTA(flip=True, translate=1, final_only=False, fraction=0.3)])
    t.fit(summary=False)
    assert t.state.compile_graphs_after_warmup == 0


@pytest.mark.slow
def test_a_compiled_run_with_selective_backprop_compiles_its_scoring_and_partial_step_in_the_warm_up(monkeypatch):
    """Selective backprop from half-way: its scoring pass (no gradients) and its step on half the
    batch are other graphs. The warm-up compiles them (Algorithm.step_paths); without that, they
    compile inside timed training, which the count shows."""
    from hasten.algorithms import SelectiveBackprop
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 256, (48, 16, 16, 3), dtype=torch.uint8, generator=g), torch.arange(48) % 10

    def run():
        torch._dynamo.reset()   # nothing compiled by an earlier run is reused
        torch.manual_seed(0)
        t = Trainer(SpeedrunNet(widths=(8, 8, 8)), DeviceLoader(x, y, 16, mean=(128,) * 3, std=(64,) * 3, drop_last=True),
                    max_duration="2ep", compile=True, device="cpu",
                    algorithms=[ChannelsLast(), SelectiveBackprop(keep=0.5, start="0.5dur")])
        t.fit(summary=False)
        return t.state.compile_graphs_after_warmup

    assert run() == 0
    monkeypatch.setattr(SelectiveBackprop, "step_paths", lambda self, state: [])
    with pytest.warns(UserWarning, match="compiled during timed training"):
        assert run() > 0


def test_tta_averages_the_views():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(5))
    x = _images(4)
    model(x)
    pad = F.pad(x, (1, 1, 1, 1), mode="reflect")
    down, up = pad[..., 2:, 2:], pad[..., :-2, :-2]     # shifted by (+1, +1) and (-1, -1)

    def both(z):
        return (model(z) + model(z.flip(-1))) / 2
    want = 0.5 * both(x) + 0.25 * both(down) + 0.25 * both(up)
    torch.testing.assert_close(hf.tta_logits(model, x, flip=True, translate=1), want)


def test_tta_fraction_spends_the_extra_views_on_the_least_sure_images():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(5))
    x = _images(10).contiguous(memory_format=torch.channels_last)
    plain = model(x).detach()
    full = hf.tta_logits(model, x, flip=True, translate=1)             # all six views
    p = plain.softmax(-1).sort(-1, descending=True).values
    unsure = (p[:, 0] - p[:, 1]).argsort()[:3]                          # 0.3 of 10 images
    want = plain.clone()
    want[unsure] = full[unsure]
    torch.testing.assert_close(hf.tta_logits(model, x, translate=1, fraction=0.3), want)
    torch.testing.assert_close(hf.tta_logits(model, x, translate=1, fraction=1.0), full)
    torch.testing.assert_close(hf.tta_logits(model, x, translate=1, fraction=0.0), plain)
    with pytest.raises(ValueError, match="fraction"):
        TTA(fraction=1.5)


@pytest.mark.filterwarnings("ignore:ema:UserWarning")
def test_tta_inside_an_averages_final_evaluation_augments_each_evaluation_once_and_counts_both(monkeypatch):
    """EMA judges the trained weights by an evaluation inside the final one: each of the two
    evaluations sees the six views once (not views of views), and TTA's method time covers both.
    The clock is a counter the model's forward advances, so the time is a count of forwards."""
    import types

    import hasten.algorithms.tta as tta_module
    from hasten.algorithms import EMA
    torch.manual_seed(0)
    x, y = _images(16), torch.arange(16) % 5
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(144, 5))
    clock = {"t": 0.0, "forwards": 0}

    def tick(module, inputs):
        if not module.training:
            clock["t"] += 1.0
            clock["forwards"] += 1
    model.register_forward_pre_hook(tick)
    monkeypatch.setattr(tta_module, "time", types.SimpleNamespace(perf_counter=lambda: clock["t"]))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    t = Trainer(model, data, eval_dataloader=data, max_duration="2ba", eval_interval="2ba", device="cpu",
                algorithms=[TTA(flip=True, translate=1), EMA(half_life="1ba")],
                optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
    t.fit(summary=False)
    assert clock["forwards"] == 2 * 2 * 6          # two evaluations x two batches x six views
    assert t.state.method_seconds == pytest.approx(24.0)
    assert t.state.forward_model is not None and not isinstance(t.state.forward_model, tta_module._TTAModel)


@pytest.mark.slow
def test_tta_does_not_lower_accuracy_of_a_trained_model(cifar_zip):
    """Measured behaviour: on a small trained CIFAR model, flip+translate TTA does not hurt."""
    from hasten.data.cifar import MEAN, STD, load_cifar10
    data = load_cifar10(cifar_zip)
    torch.manual_seed(0)
    train = DeviceLoader(data.train_x[:4000], data.train_y[:4000], 200, mean=MEAN, std=STD, translate=2,
                         flip="random", channels_last=True)
    test = DeviceLoader(data.test_x[:2000], data.test_y[:2000], 1000, mean=MEAN, std=STD, shuffle=False)
    import torchmetrics
    tr = Trainer(SpeedrunNet(widths=(16, 32, 32)), train, eval_dataloader=test, max_duration="4ep",
                 eval_interval="4ep", device="cpu",
                 optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9, nesterov=True),
                 metrics={"acc": torchmetrics.classification.MulticlassAccuracy(10, average="micro")},
                 algorithms=[ChannelsLast(), PatchWhitening(num_images=2000)])
    tr.fit()
    plain = tr.evaluate()["val/acc"]
    tta = TTA(translate=1, final_only=False)
    tr.state.algorithms.append(tta)
    tr.engine.rebuild()
    with_tta = tr.evaluate()["val/acc"]
    assert plain > 0.3
    assert with_tta >= plain - 0.005, (plain, with_tta)


def test_channels_last_algorithm_keeps_the_math():
    torch.manual_seed(0)
    a = SpeedrunNet(widths=(8, 8, 8))
    b = SpeedrunNet(widths=(8, 8, 8))
    b.load_state_dict(a.state_dict())
    tr = Trainer(b, [(_images(4, h=16, w=16), torch.zeros(4, dtype=torch.long))], device="cpu",
                 algorithms=[ChannelsLast()], max_duration="1ba")
    assert b.groups[0][0].weight.is_contiguous(memory_format=torch.channels_last)
    x = _images(4, h=16, w=16)
    torch.testing.assert_close(a.eval()(x), b.eval()(x.contiguous(memory_format=torch.channels_last)),
                               rtol=1e-4, atol=1e-5)
    tr.fit()


def test_speedrun_net_size():
    from hasten.models import forward_flops
    flops = forward_flops(SpeedrunNet(), torch.zeros(1, 3, 32, 32))
    assert 0.23e9 < flops < 0.24e9   # 31x31 after the unpadded 2x2 stem


def test_a_compiled_run_warms_every_resizing_shape_up_and_undoes_it():
    """The warm-up of a compiled run computes a step at every image size progressive resizing
    will produce, then puts everything back: the next step starts from the same weights,
    buffers and random state (here checked without compiling, on the same code path)."""
    from hasten.algorithms import ProgressiveResizing
    from hasten.microbatch import StepSnapshot
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 4, (16,))
    pr = ProgressiveResizing(initial_scale=0.5, finish=0.6, size_increment=4)
    sizes = [v[0].shape[-1] for v in pr.batch_variants(None, (x, y))]
    assert sizes == [16, 20, 24, 28, 32]   # the full size too: the run reaches it
    t = Trainer(model, [(x, y)], max_duration="1ba", algorithms=[pr])
    t._prepare_step(t.state.train_dataloader)
    t.state.batch = (x, y)
    before = StepSnapshot(model, torch.device("cpu"))
    weights = [p.detach().clone() for p in model.parameters()]
    t._warm_up_compiled((x, y))
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(b, s) for b, s in before.buffers)           # batch-norm statistics put back
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))
    assert torch.equal(torch.get_rng_state(), before.cpu_rng) and t.state.batch[0] is x


@pytest.mark.slow
def test_a_compiled_run_with_progressive_resizing_compiles_nothing_inside_timed_steps():
    from hasten.algorithms import ProgressiveResizing
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    data = [(torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))) for _ in range(6)]
    t = Trainer(model, data, eval_dataloader=data[:1], max_duration="6ba", compile=True,
                algorithms=[ProgressiveResizing(initial_scale=0.5, finish=0.8, size_increment=4)])
    t.fit(summary=False)
    assert t.state.compile_graphs_after_warmup == 0


def test_last_batch_size_is_known_without_loading_for_the_loaders_hasten_warms_up():
    from torch.utils.data import DataLoader, TensorDataset
    from hasten.data import DeviceLoader
    from hasten.data.sharding import last_batch_size
    from hasten.data.text import EvalWindows
    x, y = torch.randn(10, 3, 4, 4), torch.randint(0, 4, (10,))
    images = torch.randint(0, 256, (10, 4, 4, 3), dtype=torch.uint8)
    loader = DeviceLoader(images, y, batch_size=4, shuffle=False)
    assert last_batch_size(loader) == [len(b[0]) for b in loader][-1] == 2
    assert last_batch_size(DeviceLoader(images, y, batch_size=4, drop_last=True)) == 4
    ds = TensorDataset(x, y)
    for loader in (DataLoader(ds, batch_size=3), DataLoader(ds, batch_size=3, shuffle=True)):   # counted by loading
        assert last_batch_size(loader) == [len(b[0]) for b in loader][-1] == 1
    assert last_batch_size(DataLoader(ds, batch_size=3, drop_last=True)) == 3
    windows = EvalWindows(torch.arange(100), block_size=8, batch_size=5)   # 12 windows: 5, 5, 2
    assert last_batch_size(windows) == [len(b[0]) for b in windows][-1] == 2
    assert last_batch_size([(x[:4], y[:4]), (x[:3], y[:3])]) == 3
    assert last_batch_size(iter([(x, y)])) is None   # an iterable without a length: unknown


def test_the_compiled_warm_up_also_steps_on_the_last_smaller_batch_and_undoes_it():
    from hasten.microbatch import StepSnapshot
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    data = [(torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))), (torch.randn(3, 3, 16, 16), torch.randint(0, 4, (3,)))]
    t = Trainer(model, data, eval_dataloader=data, max_duration="1ba")
    sizes = []
    t._prepare_step(t.state.train_dataloader)
    step = t._step
    t._step = lambda state: (sizes.append(state.batch[0].shape[0]), step(state))
    t.state.batch = data[0]
    before = StepSnapshot(model, torch.device("cpu"))
    weights = [p.detach().clone() for p in model.parameters()]
    t._warm_up_compiled(data[0])
    assert sizes == [8, 3]   # the batch itself and one of the last batch's size
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(b, s) for b, s in before.buffers)
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))
    assert t.state.batch is data[0] and model.training


@pytest.mark.slow
def test_a_compiled_run_with_smaller_last_batches_compiles_nothing_inside_timed_steps():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    data = [(torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))) for _ in range(3)]
    data.append((torch.randn(5, 3, 16, 16), torch.randint(0, 4, (5,))))   # a last, smaller batch
    evals = [data[0], (data[3][0][:3], data[3][1][:3])]                    # and a smaller last evaluation batch
    t = Trainer(model, data, eval_dataloader=evals, max_duration="8ba", eval_interval="4ba", compile=True)
    t.fit(summary=False)
    assert t.state.compile_graphs_after_warmup == 0


def test_bench_records_say_which_evaluation_seconds_a_method_counted():
    """Test-time augmentation counts its evaluation as method time (hence timed work); the bench
    record of that evaluation says how much (eval_method_s), so that it is not counted twice."""
    import io
    import json
    from hasten.bench.recording import BenchRecorder
    out = io.StringIO()   # the record file
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    data = [(_images(8), torch.randint(0, 3, (8,))) for _ in range(4)]
    t = Trainer(model, data, eval_dataloader=data[:2], max_duration="4ba", eval_interval="2ba", device="cpu",
                algorithms=[TTA(flip=True, translate=1)], callbacks=[BenchRecorder(out)])
    t.fit(summary=False)
    evals = [r for r in map(json.loads, out.getvalue().splitlines()) if r["kind"] == "eval"]
    assert [e["batch"] for e in evals] == [2, 4]
    assert evals[0]["eval_method_s"] == 0.0                        # TTA only at the final evaluation
    final = evals[-1]
    assert 0 < final["eval_method_s"] <= final["eval_s"]
    assert final["method_setup_s"] == pytest.approx(t.state.method_seconds) and t.state.method_seconds >= final["eval_method_s"]


def _small_cifar_folder(path, n_train=100, n_test=60, seed=0):
    """The official CIFAR-10 python layout with random images: 5 x `n_train` to train on."""
    import pickle
    g = torch.Generator().manual_seed(seed)
    path.mkdir()
    for name, n in [(f"data_batch_{i}", n_train) for i in range(1, 6)] + [("test_batch", n_test)]:
        data = torch.randint(0, 256, (n, 3072), dtype=torch.uint8, generator=g).numpy()
        labels = torch.randint(0, 10, (n,), generator=g).tolist()
        (path / name).write_bytes(pickle.dumps({b"data": data, b"labels": labels}))
    return path


@pytest.mark.parametrize("foreach", [False, True])
def test_the_speedrun_recipe_never_waits_on_the_device_inside_a_step(foreach, tmp_path):
    """`cifar10-fast` as written (device loader with alternating flips and translation, patch
    whitening with its bias freezing mid-run, progressive resizing, Muon, label smoothing, frozen
    BN scale) reads no value back to the host between one batch's CHECKPOINT and the next's
    BATCH_END, the loader's fetch included: on a GPU each such read would make the host wait for
    the device every step. Caught at the dispatcher, so reads from C++ count too. Muon both
    ways: its per-kernel loop (CPU's default) and its stacked multi-tensor step (CUDA's)."""
    import sync_trap
    from hasten.build import build_run
    from hasten.config import load_recipe
    data = _small_cifar_folder(tmp_path / "cifar")
    recipe = load_recipe("cifar10-fast", [f"data.path={data}", "data.batch_size=50", "data.eval_batch_size=30",
                                          "algorithms.patch_whitening.num_images=100",
                                          "algorithms.patch_whitening.train_bias_for=1ep",
                                          "trainer.max_duration=3ep", "trainer.eval_interval=3ep",
                                          "trainer.log_interval=7ba", f"trainer.run_dir={tmp_path / 'run'}",
                                          "trainer.precision=fp32", f"optimizer.muon.foreach={str(foreach).lower()}"])
    run = build_run(recipe, progress_bar=True, console_logger=False)
    mode, trap = sync_trap.dispatch_trap(quiet=True)
    run.trainer.add_callbacks(trap)
    with mode:
        run.trainer.fit()
    run.trainer.close()
    assert run.trainer.state.timestamp.batch == 30
    assert trap.steps == 30 - 3   # all but each epoch's first batch (the loader's epoch starts on the host)
