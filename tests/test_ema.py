"""EMA against PyTorch's own implementation (torch.optim.swa_utils)."""
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from hasten import Trainer
from hasten.algorithms import EMA

from tiny import loader, mlp


def test_ema_matches_swa_utils_averaged_model():
    torch.manual_seed(0)
    model = mlp()
    ref_model = mlp()
    ref_model.load_state_dict(model.state_dict())
    decay = 0.8
    ema = EMA(decay=decay, final_swap=False, bias_correction=False)
    tr = Trainer(model, loader(n=64, batch_size=8), max_duration="8ba", device="cpu", algorithms=[ema],
                 optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.5))
    tr.fit()
    # the same training by hand, averaged by torch's AveragedModel (its first update copies)
    avg = AveragedModel(ref_model, multi_avg_fn=get_ema_multi_avg_fn(decay))
    avg.update_parameters(ref_model)   # count the initial weights, as hasten's EMA starts from them
    opt = torch.optim.SGD(ref_model.parameters(), lr=0.5)
    for x, y in loader(n=64, batch_size=8):
        loss = torch.nn.functional.cross_entropy(ref_model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        avg.update_parameters(ref_model)
    for ours, theirs in zip(ema.ema, avg.module.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)


def test_ema_weights_are_used_for_evaluation_and_restored():
    torch.manual_seed(0)
    model = mlp()
    ema = EMA(decay=0.5, final_swap=False)
    tr = Trainer(model, loader(n=32, batch_size=8), max_duration="4ba", device="cpu", algorithms=[ema],
                 eval_dataloader=loader(n=16, batch_size=16), optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=1.0))
    tr.fit()
    live = [p.detach().clone() for p in model.parameters()]
    got = tr.evaluate()["val/loss"]
    x, y = next(iter(loader(n=16, batch_size=16)))
    probe = mlp()
    with torch.no_grad():
        for p, e in zip(probe.parameters(), ema.ema):
            p.copy_(e)
        expected = torch.nn.functional.cross_entropy(probe(x), y).item()
    assert abs(got - expected) < 1e-6
    for p, q in zip(model.parameters(), live):
        assert torch.equal(p, q)


def _iterates(decay=None, **kw):
    """Train 8 steps; the EMA and every iterate (the weights after each step)."""
    from hasten import Callback
    torch.manual_seed(0)
    model = mlp()
    seen = []

    class Keep(Callback):
        def batch_end(self, state, logger):
            seen.append([p.detach().clone() for p in state.model.parameters()])

    ema = EMA(decay=decay, final_swap=False, **kw)
    Trainer(model, loader(n=64, batch_size=8), max_duration="8ba", device="cpu", algorithms=[ema], callbacks=[Keep()],
            optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.5)).fit()
    return ema, seen


def test_bias_corrected_ema_is_the_decay_weighted_mean_of_the_iterates():
    decay = 0.9
    ema, seen = _iterates(decay, update_every=2)
    d = decay ** 2
    updates = seen[1::2]   # batches 2, 4, 6, 8
    w = torch.tensor([d ** (len(updates) - 1 - i) for i in range(len(updates))], dtype=torch.float64)
    w = w / w.sum()
    for k, ours in enumerate(ema.ema[: len(updates[0])]):
        expected = sum(wi * u[k].double() for wi, u in zip(w, updates))
        torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=1e-6)


def test_half_life_in_typed_time_and_a_warning_when_longer_than_the_run():
    import pytest
    ema, _ = _iterates(half_life="2ba")
    assert ema.decay == pytest.approx(0.5 ** 0.5)
    ema, _ = _iterates(half_life="0.25dur")   # 2 of 8 batches
    assert ema.decay == pytest.approx(0.5 ** 0.5)
    with pytest.warns(UserWarning, match="longer than the run"):
        _iterates(decay=0.999)
    with pytest.raises(ValueError, match="either decay or half_life"):
        EMA(decay=0.9, half_life="2ba")


def test_a_short_run_with_ema_is_not_worse_than_without():
    """The reported failure: 78 steps, EMA(0.99, update_every=5) once swapped in an average that
    was still 85% the initial weights (chance accuracy)."""
    import warnings
    from torch.utils.data import DataLoader, TensorDataset
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(10, 20, generator=g) * 2
    y = torch.randint(0, 10, (2000,), generator=g)
    x = centers[y] + torch.randn(2000, 20, generator=g) * 2.5
    xt, yt = x[:1000], y[:1000]
    accs = {}
    for name, algos in (("plain", []), ("ema", [EMA(decay=0.99, update_every=5)])):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Trainer(model, DataLoader(TensorDataset(x[1000:], y[1000:]), batch_size=64, shuffle=True),
                    max_duration="78ba", device="cpu", algorithms=algos,
                    optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.05)).fit()
        with torch.no_grad():
            accs[name] = (model(xt).argmax(1) == yt).float().mean().item()
    assert accs["plain"] > 0.5, accs          # the task is learnable in 78 steps
    assert accs["ema"] >= accs["plain"] - 0.05, accs


def test_final_swap_always_keeps_the_average_without_judging_it_on_the_evaluation_data():
    """The same run as the fault test where the average loses: with final_swap='always' the
    average stays in (the model's weights are the average's, the logged loss is the average's
    loss recomputed by hand), no second evaluation runs, and nothing is warned."""
    import warnings

    import pytest
    from tiny import classification_data
    x, y = classification_data(256)
    data = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)]
    torch.manual_seed(0)
    model = mlp()
    ema = EMA(decay=0.9, final_swap="always")
    tr = Trainer(model, data, max_duration="16ba", device="cpu", algorithms=[ema], eval_interval="16ba",
                 eval_dataloader=data, optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.5))
    judged = []
    tr.state.evaluate = lambda: judged.append(1) or {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tr.fit()
    assert judged == []
    for p, e in zip(model.parameters(), ema.ema):
        assert torch.equal(p, e)
    with torch.no_grad():
        by_hand = torch.nn.functional.cross_entropy(model(x), y).item()
    assert tr.state.eval_metrics["val/loss"] == pytest.approx(by_hand, rel=1e-5)
    assert tr.logger.latest["ema/average_kept"] == 1.0
    with pytest.raises(ValueError, match="final_swap must be true"):
        EMA(final_swap="yes")
