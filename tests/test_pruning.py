"""InfoBatch, selective backprop and proxy selection, against independent references."""
import copy
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import hasten.functional as hf
from hasten import Algorithm, Trainer
from hasten.algorithms import InfoBatch, InfoBatchPruner, ProxySelection, SelectiveBackprop
from hasten.data import DeviceLoader, TensorPairs, make_dataloader
from hasten.optim import LRSchedule

from tiny import classification_data, mlp, model_and_twin


# ---------------------------------------------------------------------------- the plan
def test_plan_prunes_only_below_mean_at_the_ratio_and_is_unbiased():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(200_000, generator=g) ** 3          # skewed: most samples below the mean
    seen = torch.ones_like(scores, dtype=torch.bool)
    kept, w = hf.infobatch_plan(scores, seen, 0.5, torch.Generator().manual_seed(1))
    below = scores < scores.mean()
    dropped = torch.ones_like(below)
    dropped[kept] = False
    assert not (dropped & ~below).any()                        # only well-learned samples are dropped
    assert (dropped.sum() / below.sum()).item() == pytest.approx(0.5, abs=0.01)
    assert torch.all(w[kept][below[kept]] == 2.0) and torch.all(w[~below] == 1.0)
    # unbiased: the expected weighted sum of any per-sample quantity over kept samples is the full sum
    v = torch.randn(200_000, generator=g)
    est = torch.stack([(lambda k, ww: (v[k] * ww[k]).sum())(*hf.infobatch_plan(scores, seen, 0.5, torch.Generator().manual_seed(s)))
                       for s in range(40)])
    assert est.mean().item() == pytest.approx(v.sum().item(), abs=4 * est.std().item() / 40 ** 0.5 + 1e-6)


def test_nothing_is_pruned_before_scores_exist_and_global_rng_is_untouched():
    p = InfoBatchPruner(100, prune_ratio=0.5, num_epochs=10)
    before = torch.random.get_rng_state()
    assert p.start_epoch(0)["infobatch/kept"] == 100          # no scores yet
    p.update(torch.rand(100, generator=torch.Generator().manual_seed(0)), torch.arange(100))
    stats = p.start_epoch(1)
    assert stats["infobatch/kept"] < 100
    assert torch.equal(torch.random.get_rng_state(), before)
    assert p.start_epoch(9)["infobatch/kept"] == 100          # 9/10 >= delta 0.875: full data again


# ---------------------------------------------------------------------------- plain loop
def test_three_line_plain_loop_matches_losses_to_samples():
    n = 40
    x = torch.randn(n, 3)
    ds = TensorDataset(x, torch.arange(n))                      # the target is the sample's own index
    pruner = InfoBatchPruner(n, prune_ratio=0.5, num_epochs=4, seed=1)
    loader = DataLoader(ds, batch_size=8, sampler=pruner.sampler, num_workers=0)
    for epoch in range(3):
        seen = []
        for xb, idx in loader:
            losses = xb.pow(2).sum(1)                           # a per-sample "loss" we can recompute
            loss = pruner.loss(losses)
            w = pruner.weights[idx] if pruner.weights is not None else torch.ones(len(idx))
            assert loss.item() == pytest.approx((losses * w).mean().item())
            seen.append(idx)
        seen = torch.cat(seen)
        assert len(seen) == len(loader.sampler) == pruner.count
        torch.testing.assert_close(pruner.scores[seen], x[seen].pow(2).sum(1))
    assert pruner.stats()["infobatch/saved_fraction"] > 0


# ---------------------------------------------------------------------------- in the Trainer
def _device_data(n=96, d=6):
    x, y = classification_data(n=n, d_in=d)
    return x, y


class _ImageLike(nn.Module):
    """An MLP that takes (N, 1, 1, d) 'images' from a DeviceLoader."""
    def __init__(self, d=6):
        super().__init__()
        self.net = mlp(d_in=d)

    def forward(self, x):
        return self.net(x.flatten(1))


def _device_loader(n=96, batch=16, seed=0):
    x, y = classification_data(n=n, d_in=6)
    imgs = ((x - x.min()) / (x.max() - x.min()) * 255).round().to(torch.uint8).view(n, 1, 1, 6)
    return DeviceLoader(imgs, y, batch, layout="nchw", seed=seed)


class _Record(Algorithm):
    def __init__(self):
        self.epoch_batches, self.lrs, self._n = [], [], 0

    def batch_start(self, state, logger):
        self._n += len(state.batch[0])
        self.lrs.append(state.optimizers[0].param_groups[0]["lr"])

    def epoch_end(self, state, logger):
        self.epoch_batches.append(self._n)
        self._n = 0


def test_infobatch_in_the_trainer_prunes_and_the_schedule_still_ends(tmp_path):
    rec = _Record()
    from hasten.loggers import JSONLLogger
    tr = Trainer(_ImageLike(), _device_loader(), max_duration="8ep", device="cpu", log_interval="1ep",
                 optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                 schedulers=[LRSchedule("linear", min_factor=0.0)], algorithms=[rec, InfoBatch(0.5, 0.75)],
                 loggers=[JSONLLogger(tmp_path / "m.jsonl")])
    tr.fit()
    full = 96 // 16
    assert rec.epoch_batches[0] == 96                             # first epoch: no scores, no pruning
    assert all(n < 96 for n in rec.epoch_batches[1:6]), rec.epoch_batches   # epochs 1..5 prune
    assert rec.epoch_batches[6:] == [96, 96]                      # from 75% of the run: all data
    assert tr.state.timestamp.epoch == 8
    assert rec.lrs[-1] == pytest.approx(0.1 / (8 * full), rel=1e-6)   # the linear schedule reached its end
    pruner = tr.state.algorithms[1].pruner
    assert tr.state.timestamp.sample == pruner.passes
    import json
    rows = [json.loads(line) for line in open(tmp_path / "m.jsonl")]
    saved = [r["infobatch/saved_fraction"] for r in rows if "infobatch/saved_fraction" in r]
    assert saved and saved[-1] == pytest.approx(1 - pruner.passes / (8 * 96))


def test_infobatch_rescaled_loss_reaches_the_gradient():
    """The step's loss is the mean over the kept batch of weight * per-sample loss."""
    grads = []

    class Check(Algorithm):
        def after_backward(self, state, logger):
            x, y, idx = state.micro_batch
            model = state.model
            w = ib.pruner.weights[idx] if ib.pruner.weights is not None else torch.ones(len(idx))
            ref = torch.func.functional_call(model, dict(model.named_parameters()), (x,))
            loss = (F.cross_entropy(ref, y, reduction="none") * w).mean()
            g = torch.autograd.grad(loss, list(model.parameters()))
            grads.append(all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(g, model.parameters())))

    ib = InfoBatch(0.5, 0.9)
    Trainer(_ImageLike(), _device_loader(), max_duration="3ep", device="cpu", algorithms=[Check(), ib]).fit()
    assert grads and all(grads)


def test_infobatch_with_a_dataloader_resumes_exactly(tmp_path):
    x, y = classification_data(n=64, d_in=8)

    def make(save=None, load=None, stop_at=None):
        torch.manual_seed(0)
        model = mlp()
        algos = [InfoBatch(0.5, 0.875)]
        if stop_at:
            class Stop(Algorithm):
                def batch_end(self, state, logger):
                    if state.timestamp.batch == stop_at:
                        state.stop_training = True
            algos.append(Stop())
        loader = make_dataloader(TensorPairs(x, y), 8, shuffle=True, seed=0, num_workers=0)
        return Trainer(model, loader, max_duration="6ep", device="cpu", algorithms=algos, save_folder=save,
                       save_interval="1000ba", load_path=load,
                       optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))

    straight = make()
    straight.fit()
    first = make(save=str(tmp_path), stop_at=17)       # epoch 2 is pruned; stop in its middle
    first.fit()
    assert first.state.timestamp.batch_in_epoch > 0
    ckpt = first.save_checkpoint(tmp_path / "mid.pt")
    resumed = make(load=str(ckpt))
    resumed.fit()
    assert resumed.state.timestamp.sample == straight.state.timestamp.sample
    for a, b in zip(straight.state.model.parameters(), resumed.state.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_infobatch_does_no_host_sync_inside_steps(monkeypatch):
    import sync_trap
    trap = sync_trap.install(monkeypatch)
    tr = Trainer(_ImageLike(), _device_loader(), max_duration="4ep", device="cpu", log_interval="1000ba",
                 optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                 algorithms=[trap, InfoBatch(0.5)])
    tr.fit()
    assert trap.steps == tr.state.timestamp.batch > 0


def test_infobatch_needs_a_loader_it_can_steer():
    x, y = classification_data(n=32)
    with pytest.raises(TypeError, match="DeviceLoader"):
        Trainer(mlp(), DataLoader(TensorDataset(x, y), batch_size=8), max_duration="1ep", device="cpu",
                algorithms=[InfoBatch()]).fit()


def _spawn_ranks(rank, world, port, out):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    p = InfoBatchPruner(16, prune_ratio=0.5, num_epochs=10)
    p.start_epoch(0)
    mine = torch.arange(rank, 16, world)              # each rank scores its own shard
    p.update((mine.float() + 1) ** 2, mine)
    p.start_epoch(1)
    out[rank] = (p.state_dict()["scores"].clone(), p.kept.clone(), p.epoch_order(1).clone())
    dist.destroy_process_group()


def test_infobatch_ranks_share_scores_and_plan():
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_spawn_ranks, args=(2, port, out), nprocs=2)
    (s0, k0, o0), (s1, k1, o1) = out[0], out[1]
    torch.testing.assert_close(s0, (torch.arange(16).float() + 1) ** 2)   # every rank has every score
    assert torch.equal(s0, s1) and torch.equal(k0, k1)                     # and the same plan
    assert not set(o0.tolist()) & set(o1.tolist()) and len(o0) == len(o1) == len(k0) // 2


# ---------------------------------------------------------------------------- selective backprop
def test_select_hardest_is_topk():
    losses = torch.tensor([0.1, 2.0, 0.5, 3.0, 1.0, 0.2])
    assert sorted(hf.select_hardest(losses, 0.5).tolist()) == [1, 3, 4]


def test_select_weighted_draws_each_sample_with_weight_percentile_to_the_beta():
    # one draw (keep 1/4 of 4): P(sample) = w / sum(w), w = (rank / n)^beta, closed form
    losses = torch.tensor([0.3, 5.0, -1.0, 2.0])          # ranks 2, 4, 1, 3
    g = torch.Generator().manual_seed(0)
    for beta in (0.0, 1.0, 3.0):
        w = torch.tensor([2.0, 4.0, 1.0, 3.0]) ** beta
        counts = torch.zeros(4)
        for _ in range(20000):
            counts[hf.select_weighted(losses, 0.25, beta, generator=g)] += 1
        torch.testing.assert_close(counts / 20000, w / w.sum(), atol=0.012, rtol=0)
    # several drawn: distinct samples, as many as keep says
    idx = hf.select_weighted(torch.randn(10, generator=g), 0.5, 2.0, generator=g)
    assert len(idx) == 5 and len(set(idx.tolist())) == 5
    with pytest.raises(ValueError, match="beta"):
        hf.select_weighted(losses, 0.5, -1.0)


def _chosen_rows(x, state_batch):
    """The rows of x the training pass saw (each row of x is distinct)."""
    seen = state_batch[0]
    return sorted(int((x == row).all(1).nonzero()) for row in seen)


def test_selective_backprop_beta_trains_on_the_drawn_samples_and_favours_the_hard_ones():
    x, y = classification_data(n=8)
    model, ref_model = model_and_twin()
    chosen, grads = [], []

    class Grab(Algorithm):
        def after_backward(self, state, logger):
            chosen.append(_chosen_rows(x, state.batch))
            grads.append([p.grad.clone() for p in state.model.parameters()])

    # lr 0: every step sees the same losses, so the draws follow one fixed distribution
    Trainer(model, [(x, y)] * 300, max_duration="300ba", device="cpu",
            algorithms=[SelectiveBackprop(0.125, beta=3.0), Grab()],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.0)).fit()
    with torch.no_grad():
        losses = F.cross_entropy(ref_model(x), y, reduction="none")
    for idx, g in zip(chosen[:3], grads[:3]):              # the step's gradient is that of the drawn sample
        ref_model.zero_grad()
        F.cross_entropy(ref_model(x[idx]), y[idx]).backward()
        for a, b in zip(g, ref_model.parameters()):
            torch.testing.assert_close(a, b.grad)
    counts = torch.zeros(8)
    for idx in chosen:
        counts[idx] += 1
    w = ((losses.argsort().argsort() + 1).float() / 8) ** 3
    torch.testing.assert_close(counts / len(chosen), w / w.sum(), atol=0.08, rtol=0)


def test_selective_backprop_beta_zero_draws_uniformly_without_a_scoring_pass():
    x, y = classification_data(n=16)
    torch.manual_seed(0)
    model = mlp()
    forwards, chosen = [0], []
    model.register_forward_hook(lambda *a: forwards.__setitem__(0, forwards[0] + 1))

    class Grab(Algorithm):
        def after_backward(self, state, logger):
            chosen.append(_chosen_rows(x, state.batch))

    Trainer(model, [(x, y)] * 200, max_duration="200ba", device="cpu",
            algorithms=[SelectiveBackprop(0.25, beta=0), Grab()],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.0)).fit()
    assert forwards[0] == 200                              # one pass a step: no scoring pass
    assert all(len(c) == 4 and len(set(c)) == 4 for c in chosen)
    counts = torch.zeros(16)
    for idx in chosen:
        counts[idx] += 1
    assert counts.min() > 0.25 * 200 * 0.4 and counts.max() < 0.25 * 200 * 1.8   # every sample, about equally
    with pytest.raises(ValueError, match="nothing to act on"):
        SelectiveBackprop(0.5, beta=0, score_every=2)
    with pytest.raises(ValueError, match="must be null or >= 0"):
        SelectiveBackprop(0.5, beta=-0.5)


def test_selective_backprop_gradient_is_that_of_the_hardest_samples():
    x, y = classification_data(n=32)
    model, ref_model = model_and_twin()
    grads = {}

    class Grab(Algorithm):
        def after_backward(self, state, logger):
            grads["sb"] = [p.grad.clone() for p in state.model.parameters()]
            state.stop_training = True

    Trainer(model, [(x, y)], max_duration="1ba", device="cpu", algorithms=[SelectiveBackprop(0.25), Grab()],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.0)).fit()
    with torch.no_grad():
        losses = F.cross_entropy(ref_model(x), y, reduction="none")
    hard = losses.argsort(descending=True)[:8]
    F.cross_entropy(ref_model(x[hard]), y[hard]).backward()
    for g, p in zip(grads["sb"], ref_model.parameters()):
        torch.testing.assert_close(g, p.grad)


def test_selective_backprop_with_score_scale_ranks_by_the_loss_of_downscaled_images():
    # a tiny conv net with global max pooling, which takes any image size; no batch norm (the ranking alone)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 3, 16, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(),
                          nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    ref = copy.deepcopy(model)
    grads = {}

    class Grab(Algorithm):
        def after_backward(self, state, logger):
            grads["sb"] = [p.grad.clone() for p in state.model.parameters()]

    Trainer(model, [(x, y)], max_duration="1ba", device="cpu",
            algorithms=[SelectiveBackprop(0.25, score_scale=0.5), Grab()],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.0)).fit()
    with torch.no_grad():   # the reference: torch's own area downscaling to 8 px, then the loss there
        small = F.interpolate(x, size=(8, 8), mode="area")
        losses = F.cross_entropy(ref(small), y, reduction="none")
    full = F.cross_entropy(ref(x), y, reduction="none").detach()
    hard = losses.argsort(descending=True)[:8]
    assert set(hard.tolist()) != set(full.argsort(descending=True)[:8].tolist())   # the scale changes the choice
    F.cross_entropy(ref(x[hard]), y[hard]).backward()   # the step itself at full size
    for a, b in zip(grads["sb"], ref.parameters()):
        torch.testing.assert_close(a, b.grad)
    with pytest.raises(ValueError, match="score_scale"):
        SelectiveBackprop(0.5, score_scale=1.5)


@pytest.mark.parametrize("which", ["both", "scoring", "training"])
def test_selective_backprop_running_stats_come_from_the_chosen_pass(which):
    x, y = classification_data(n=32)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(x.shape[1], 16), nn.BatchNorm1d(16, momentum=0.5), nn.ReLU(), nn.Linear(16, 4))
    ref = copy.deepcopy(model)
    Trainer(model, [(x, y)], max_duration="1ba", device="cpu", algorithms=[SelectiveBackprop(0.25, running_stats=which)],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.0)).fit()
    # the reference: torch's own batch norm fed the whole batch and then the hardest quarter, as chosen
    with torch.no_grad():
        losses = F.cross_entropy(ref(x), y, reduction="none")      # updates ref's statistics from all 32
    hard = losses.argsort(descending=True)[:8]
    bn_ref = ref[1]
    if which == "training":
        bn_ref.reset_running_stats()
        ref(x[hard])
    elif which == "both":
        ref(x[hard])
    bn = model[1]
    torch.testing.assert_close(bn.running_mean, bn_ref.running_mean)
    torch.testing.assert_close(bn.running_var, bn_ref.running_var)
    assert int(bn.num_batches_tracked) == int(bn_ref.num_batches_tracked)


def _bn_net(d_in, momentum):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d_in, 16), nn.BatchNorm1d(16, momentum=momentum), nn.ReLU(), nn.Linear(16, 4))


@pytest.mark.parametrize("momentum", [0.4, None])
def test_selective_backprop_average_stats_are_torchs_update_bn_over_the_last_chosen_samples(momentum):
    from torch.optim.swa_utils import update_bn
    x, y = classification_data(n=96)
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 96, 16)]   # 6 steps; the last 3 averaged
    model = _bn_net(x.shape[1], momentum)
    ref = copy.deepcopy(model)
    Trainer(model, batches, max_duration="6ba", device="cpu", algorithms=[SelectiveBackprop(0.25, average_stats=3)],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.0)).fit()
    # the reference: the hardest quarter of each of the last 3 batches, ranked by an independent copy (training
    # mode, as the method scores), then torch's own re-estimation of batch norm's statistics over those
    chosen = []
    with torch.no_grad():
        for xb, yb in batches[3:]:
            ref.train()
            chosen.append(xb[F.cross_entropy(ref(xb), yb, reduction="none").argsort(descending=True)[:4]])
    update_bn(chosen, ref)
    torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)
    torch.testing.assert_close(model[1].running_var, ref[1].running_var)


def test_selective_backprop_average_stats_leave_the_earlier_statistics_alone_and_resume_exactly(tmp_path):
    x, y = classification_data(n=96)
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 96, 16)]

    def make(average, seen=None, stop_at=None, load=None):
        class Watch(Algorithm):
            def batch_end(self, state, logger):
                if seen is not None:
                    seen[state.timestamp.batch] = state.model[1].running_mean.clone()
                if state.timestamp.batch == stop_at:
                    state.stop_training = True
        return Trainer(_bn_net(x.shape[1], 0.4), batches, max_duration="6ba", device="cpu", load_path=load,
                       algorithms=[SelectiveBackprop(0.25, average_stats=average), Watch()],
                       optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9))

    averaged, plain = {}, {}
    straight = make(3, averaged)
    straight.fit()
    make(0, plain).fit()
    for b in (1, 2, 3):      # before the last 3 steps: the method's statistics without averaging
        torch.testing.assert_close(averaged[b], plain[b], rtol=0, atol=0)
    assert not torch.allclose(averaged[6], plain[6])
    first = make(3, stop_at=4)                 # stopped inside the window, after its first step
    first.fit()
    resumed = make(3, load=str(first.save_checkpoint(tmp_path / "mid.pt")))
    resumed.fit()
    for name in ("running_mean", "running_var"):
        torch.testing.assert_close(getattr(resumed.state.model[1], name), getattr(straight.state.model[1], name),
                                   rtol=0, atol=0)


def test_selective_backprop_average_stats_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="whole number"):
        SelectiveBackprop(0.5, average_stats=-1)
    with pytest.raises(ValueError, match="choose one"):
        SelectiveBackprop(0.5, running_stats="scoring", average_stats=5)


def _sb_run(score_every, epochs=4, lr=0.0, load=None, stop_at=None, grads=None, forwards=None, start="0dur",
            record_full_steps=True):
    x, y = classification_data(n=64, d_in=8)
    torch.manual_seed(0)
    model = mlp()
    if forwards is not None:
        model.register_forward_hook(lambda *a: forwards.__setitem__(0, forwards[0] + 1))

    class Watch(Algorithm):
        def after_backward(self, state, logger):
            if grads is not None:
                grads.append(torch.cat([p.grad.flatten() for p in state.model.parameters()]).clone())

        def batch_end(self, state, logger):
            if state.timestamp.batch == stop_at:
                state.stop_training = True
    loader = make_dataloader(TensorPairs(x, y), 16, shuffle=True, seed=0, num_workers=0)
    return Trainer(model, loader, max_duration=f"{epochs}ep", device="cpu", load_path=load,
                   algorithms=[SelectiveBackprop(0.25, score_every=score_every, start=start,
                                                 record_full_steps=record_full_steps), Watch()],
                   optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9 if lr else 0.0))


def test_selective_backprop_score_every_ranks_by_recorded_losses_without_a_scoring_pass():
    # without batch norm and with lr 0 a sample's loss never changes, so ranking by recorded losses must
    # choose exactly the samples a fresh scoring pass chooses: the same gradient at every step
    fresh_grads, recorded_grads, fresh_fw, recorded_fw = [], [], [0], [0]
    _sb_run(1, grads=fresh_grads, forwards=fresh_fw).fit()
    _sb_run(2, grads=recorded_grads, forwards=recorded_fw).fit()
    assert len(fresh_grads) == len(recorded_grads) == 16
    for a, b in zip(fresh_grads, recorded_grads):
        torch.testing.assert_close(a, b)
    assert fresh_fw[0] == 2 * 16                  # a scoring pass and a training pass each step
    assert recorded_fw[0] == 2 * 8 + 8            # epochs 1 and 3 rank by recorded losses: no scoring pass


def test_selective_backprop_score_every_ranks_by_the_losses_of_full_steps_too():
    # selection from half-way through epoch 1: the full steps before it record their samples' losses,
    # so epoch 2 (ranked) holds no sample without a record and runs no scoring pass; with lr 0 and no
    # batch norm those records choose what fresh scoring chooses
    fresh_grads, recorded_grads, fresh_fw, recorded_fw = [], [], [0], [0]
    _sb_run(1, grads=fresh_grads, forwards=fresh_fw, start="0.375dur").fit()
    _sb_run(2, grads=recorded_grads, forwards=recorded_fw, start="0.375dur").fit()
    assert len(fresh_grads) == len(recorded_grads) == 16
    for a, b in zip(fresh_grads, recorded_grads):
        torch.testing.assert_close(a, b)
    assert fresh_fw[0] == 6 + 2 * 10              # 6 full steps, then a scoring and a training pass each
    assert recorded_fw[0] == 6 + 2 * 2 + 4 + 2 * 4   # epoch 1's last 2 and epoch 3 scored; epoch 2 ranked


def test_selective_backprop_without_full_steps_records_scores_the_epoch_they_last_saw_afresh():
    # the same run with record_full_steps=False: the 32 samples that epoch 1's full steps saw have no
    # record, so every batch of epoch 2 holds one and is scored afresh: the passes and the gradients of
    # scoring every step, while epoch 3 still scores afresh by the count
    fresh_grads, recorded_grads, fresh_fw, recorded_fw = [], [], [0], [0]
    _sb_run(1, grads=fresh_grads, forwards=fresh_fw, start="0.375dur").fit()
    _sb_run(2, grads=recorded_grads, forwards=recorded_fw, start="0.375dur", record_full_steps=False).fit()
    assert len(fresh_grads) == len(recorded_grads) == 16
    for a, b in zip(fresh_grads, recorded_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert recorded_fw[0] == fresh_fw[0] == 6 + 2 * 10
    with pytest.raises(ValueError, match="true or false"):
        SelectiveBackprop(0.5, score_every=2, record_full_steps="no")


def test_selective_backprop_score_every_resumes_exactly(tmp_path):
    straight = _sb_run(2, lr=0.1)
    straight.fit()
    first = _sb_run(2, lr=0.1, stop_at=6)         # inside epoch 1, which ranks by recorded losses
    first.fit()
    resumed = _sb_run(2, lr=0.1, load=str(first.save_checkpoint(tmp_path / "mid.pt")))
    resumed.fit()
    for a, b in zip(straight.state.model.parameters(), resumed.state.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_selective_backprop_score_every_says_what_it_needs():
    x, y = classification_data(n=32)
    with pytest.raises(ValueError, match="carries sample indices"):
        Trainer(mlp(), [(x, y)], max_duration="1ba", device="cpu",
                algorithms=[SelectiveBackprop(0.5, score_every=2)]).fit()
    with pytest.raises(ValueError, match="whole number"):
        SelectiveBackprop(0.5, score_every=0)
    assert SelectiveBackprop(0.5, score_every=2).ddp_refusal() is None   # shared across ranks (test_distributed)


def test_selective_backprop_refuses_an_unknown_running_stats_choice():
    with pytest.raises(ValueError, match="running_stats must be one of"):
        SelectiveBackprop(0.5, running_stats="all")


def test_proxy_selection_trains_the_proxy_and_picks_its_hardest():
    x, y = classification_data(n=32)
    torch.manual_seed(0)
    model, proxy = mlp(), mlp(hidden=4)
    ref_proxy = mlp(hidden=4)
    ref_proxy.load_state_dict(proxy.state_dict())
    picked = {}

    class Grab(Algorithm):
        def before_forward(self, state, logger):
            picked["x"] = state.micro_batch[0].clone()

    Trainer(model, [(x, y)], max_duration="1ba", device="cpu",
            algorithms=[ProxySelection(proxy, keep=0.5, lr=0.1), Grab()]).fit()
    losses = F.cross_entropy(ref_proxy(x), y, reduction="none")
    hard = losses.detach().argsort(descending=True)[:16]
    assert sorted(map(tuple, picked["x"].tolist())) == sorted(map(tuple, x[hard].tolist()))
    losses.mean().backward()
    with torch.no_grad():   # the proxy took one SGD step (momentum buffer starts at the gradient)
        for p, q in zip(ref_proxy.parameters(), proxy.parameters()):
            torch.testing.assert_close(p - 0.1 * (p.grad + 5e-4 * p) * 1.9, q, rtol=1e-5, atol=1e-6)
