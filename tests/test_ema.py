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
    ema = EMA(decay=decay, final_swap=False)
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
