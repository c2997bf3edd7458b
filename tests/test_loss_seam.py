"""Algorithms that change the loss or the targets compose through the loss seam
(Algorithm.wrap_loss): every pair, in both orders, through fit, evaluate and fit again,
checked against PyTorch's own cross-entropy (label_smoothing=) on the mixed targets."""
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Callback, Trainer
from hasten.algorithms import ChunkedCrossEntropy, CutMix, LabelSmoothing, MixUp
from hasten.models.gpt import GPT, GPTConfig

torch.manual_seed(0)
X = torch.randn(32, 1, 4, 4)
Y = torch.randint(0, 3, (32,))


def _model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))


class Record(Callback):
    """The reduced training loss of every step with what a reference needs to recompute it."""

    def __init__(self, algos):
        self.algos, self.steps = algos, []

    def before_backward(self, state, logger):
        lam = next((a._mix for a in self.algos if isinstance(a, (MixUp, CutMix))), None)
        targets, mix = state.micro_batch[1], None
        if lam is not None:   # a mixed batch carries (targets, partner targets)
            targets, partner = targets
            mix = (partner.clone(), lam)
        self.steps.append((state.loss.detach().clone(), state.outputs.detach().clone(), targets.clone(), mix))


def _expected(outputs, targets, mix, smoothing):
    ce = lambda y: F.cross_entropy(outputs, y, label_smoothing=smoothing, reduction="none")
    if mix is None:
        return ce(targets).mean()
    y_b, lam = mix
    return (lam * ce(targets) + (1 - lam) * ce(y_b)).mean()


IMAGE_ALGOS = {"label_smoothing": lambda: LabelSmoothing(0.2), "mixup": lambda: MixUp(alpha=0.4),
               "cutmix": lambda: CutMix(alpha=1.0)}


PAIRS = [p for p in itertools.permutations(IMAGE_ALGOS, 2) if set(p) != {"mixup", "cutmix"}]


@pytest.mark.parametrize("order", [["mixup", "cutmix"], ["cutmix", "label_smoothing", "mixup"]])
def test_two_mixers_are_refused_at_the_start_of_fit(order):
    tr = Trainer(_model(), DataLoader(TensorDataset(X, Y), batch_size=8), max_duration="2ba", device="cpu",
                 algorithms=[IMAGE_ALGOS[n]() for n in order])
    with pytest.raises(ValueError, match="both mix the batch"):
        tr.fit()


@pytest.mark.parametrize("first, second", PAIRS)
def test_pairs_compose_in_either_order_through_fit_evaluate_fit(first, second):
    algos = [IMAGE_ALGOS[first](), IMAGE_ALGOS[second]()]
    rec = Record(algos)
    smoothing = next((a.smoothing for a in algos if isinstance(a, LabelSmoothing)), 0.0)
    tr = Trainer(_model(), DataLoader(TensorDataset(X, Y), batch_size=8), max_duration="2ba", device="cpu",
                 algorithms=algos, callbacks=[rec], eval_dataloader=DataLoader(TensorDataset(X, Y), batch_size=16),
                 eval_interval="1ba")
    tr.fit()
    with torch.no_grad():   # evaluation is the task's plain loss, whatever wraps the training loss
        plain = F.cross_entropy(tr.state.model(X), Y).item()
    assert tr.evaluate()["val/loss"] == pytest.approx(plain, rel=1e-6)
    tr.state.max_duration = tr.state.max_duration.__class__(4, "ba")
    tr.fit()
    assert len(rec.steps) == 4
    for loss, outputs, targets, mix in rec.steps:
        assert loss.item() == pytest.approx(_expected(outputs, targets, mix, smoothing).item(), rel=1e-5, abs=1e-6)
    assert sum(m is not None for *_, m in rec.steps) >= 3   # the mixing really happened


def test_label_smoothing_wraps_a_users_loss():
    def my_loss(out, y):   # a scalar loss of the user's own: 2 x cross-entropy
        return 2 * F.cross_entropy(out, y)
    rec = Record([])
    tr = Trainer(_model(), DataLoader(TensorDataset(X, Y), batch_size=8), loss_fn=my_loss, max_duration="1ba",
                 device="cpu", algorithms=[LabelSmoothing(0.3)], callbacks=[rec])
    tr.fit()
    loss, out, y, _ = rec.steps[0]
    uniform = -F.log_softmax(out, -1).mean(-1).mean()
    assert loss.item() == pytest.approx((0.7 * 2 * F.cross_entropy(out, y) + 0.3 * uniform).item(), rel=1e-6)


def _lm():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
    tokens = torch.randint(0, 11, (16, 9))
    return model, DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4)


@pytest.mark.parametrize("other", ["label_smoothing", "mixup", "cutmix"])
@pytest.mark.parametrize("chunked_first", [True, False])
def test_chunked_cross_entropy_pairs_are_refused_with_a_reason(other, chunked_first):
    model, dl = _lm()
    algos = [ChunkedCrossEntropy(chunk_size=8), IMAGE_ALGOS[other]()]
    if not chunked_first:
        algos.reverse()
    tr = Trainer(model, dl, max_duration="2ba", device="cpu", algorithms=algos)
    reason = "never forms" if other == "label_smoothing" else "token ids"
    with pytest.raises(ValueError, match=reason):
        tr.fit()


def test_chunked_cross_entropy_evaluates_the_same_cross_entropy():
    model, dl = _lm()
    plain = Trainer(model, dl, max_duration="1ba", device="cpu").evaluate(dl)["val/loss"]
    model2, _ = _lm()
    chunked = Trainer(model2, dl, max_duration="1ba", device="cpu", algorithms=[ChunkedCrossEntropy(chunk_size=8)])
    assert chunked.evaluate(dl)["val/loss"] == pytest.approx(plain, rel=1e-5)


def test_an_algorithm_that_overrides_no_event_is_never_called():
    from hasten import Algorithm
    calls = []

    class Quiet(Algorithm):   # acts through the loss seam only
        def match(self, event, state):
            calls.append(event)
            return True

        def wrap_loss(self, loss_fn):
            return loss_fn

    assert Quiet.listens_to() == ()
    Trainer(_model(), DataLoader(TensorDataset(X, Y), batch_size=8), max_duration="2ba", device="cpu",
            algorithms=[Quiet()]).fit()
    assert calls == []
