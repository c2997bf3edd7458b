"""The training loop's contracts: reduction, accumulation, seams, evaluation, precision, errors."""
import json
import math

import pytest
import torch
import torch.nn.functional as F
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Algorithm, Callback, NonFiniteLossError, Trainer
from hasten.callbacks import ProgressBar, SpeedMonitor, LRMonitor
from hasten.loggers import JSONLLogger
from hasten.optim import LRSchedule

from tiny import classification_data, loader, mlp


def _sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _train(grad_accum, batch_size=16, steps=4, seed=0, **kw):
    torch.manual_seed(seed)
    model = mlp()
    tr = Trainer(model, loader(n=64, batch_size=batch_size), optimizers=_sgd, max_duration=f"{steps}ba",
                 device="cpu", grad_accum=grad_accum, seed=seed, **kw)
    tr.fit()
    return model


@pytest.mark.parametrize("k", [2, 3, 4])
def test_grad_accumulation_equals_one_big_batch(k):
    # no batch norm: accumulation over k micro-batches (3 splits 16 unevenly: 6, 5, 5) must
    # equal one batch of 16 up to float32 summation order
    ref, acc = _train(1), _train(k)
    for a, b in zip(ref.parameters(), acc.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_plain_loop_equivalence():
    """The Trainer's step equals the textbook loop on the same data and initialisation."""
    torch.manual_seed(0)
    model = mlp()
    ref = mlp()
    ref.load_state_dict(model.state_dict())
    x, y = classification_data(64)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for i in range(4):
        loss = F.cross_entropy(ref(x[i * 16:(i + 1) * 16]), y[i * 16:(i + 1) * 16])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    Trainer(model, loader(n=64, batch_size=16), optimizers=_sgd, max_duration="4ba", device="cpu").fit()
    for a, b in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class DropOddSamples(Algorithm):
    """Zero the loss of odd-indexed samples: they stay in the denominator."""

    def after_loss(self, state, logger):
        w = torch.ones_like(state.loss)
        w[1::2] = 0
        state.loss = state.loss * w


def test_after_loss_reweighting_reaches_the_gradient():
    torch.manual_seed(0)
    model = mlp()
    ref = mlp()
    ref.load_state_dict(model.state_dict())
    x, y = classification_data(16)
    per = F.cross_entropy(ref(x), y, reduction="none")
    per[1::2] = per[1::2] * 0
    per.mean().backward()   # same denominator (16), odd samples contribute nothing
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad
    Trainer(model, loader(n=16, batch_size=16), optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
            max_duration="1ba", device="cpu", algorithms=[DropOddSamples()], grad_accum=2).fit()
    for a, b in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_step_seam_wraps_the_forward_backward():
    calls = []

    class TwoPass(Algorithm):
        def wrap_step(self, step):
            def wrapped(state):
                calls.append("first")
                step(state)       # e.g. SAM: first pass, perturb, second pass
                calls.append("second")
                step(state)
            return wrapped

    tr = Trainer(mlp(), loader(n=16, batch_size=8), max_duration="2ba", device="cpu", algorithms=[TwoPass()])
    tr.fit()
    assert calls == ["first", "second"] * 2


def test_optimizers_built_after_model_surgery():
    class Widen(Algorithm):
        def init(self, state, logger):
            state.model[2] = nn.Linear(16, 4)   # replace a module before optimizers exist

    model = mlp()
    tr = Trainer(model, loader(), optimizers=_sgd, max_duration="1ba", device="cpu", algorithms=[Widen()])
    owned = {id(p) for p in tr.state.model.parameters()}
    assert {id(p) for g in tr.state.optimizer.param_groups for p in g["params"]} == owned
    # an optimizer built before surgery is refused with advice
    stale = mlp()
    with pytest.raises(ValueError, match="factory"):
        Trainer(stale, loader(), optimizers=torch.optim.SGD(stale.parameters(), lr=0.1),
                max_duration="1ba", device="cpu", algorithms=[Widen()])


def test_evaluate_matches_a_manual_pass():
    torch.manual_seed(0)
    model = mlp()
    x, y = classification_data(50)
    dl = DataLoader(TensorDataset(x, y), batch_size=16)   # uneven last batch
    tr = Trainer(model, metrics={"acc": torchmetrics.classification.MulticlassAccuracy(4, average="micro")},
                 device="cpu")
    res = tr.evaluate(dl)
    with torch.no_grad():
        logits = model(x)
    assert res["val/loss"] == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-6)
    assert res["val/acc"] == pytest.approx((logits.argmax(1) == y).float().mean().item())
    preds = tr.predict(dl)
    torch.testing.assert_close(torch.cat(preds), logits)


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
def test_mixed_precision_trains(precision):
    torch.manual_seed(0)
    model = mlp()
    tr = Trainer(model, loader(n=256, batch_size=32), max_duration="3ep", eval_dataloader=loader(n=256, batch_size=64),
                 precision=precision, device="cpu", optimizers=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))
    first = tr.evaluate()["val/loss"]
    tr.fit()
    assert tr.state.eval_metrics["val/loss"] < first
    assert (tr.state.scaler is not None) == (precision == "fp16-mixed")


def test_nan_loss_stops_with_the_step_range_and_no_bad_checkpoint(tmp_path):
    class Poison(Algorithm):
        def after_loss(self, state, logger):
            if state.timestamp.batch == 6:   # the 7th batch
                state.loss = state.loss * float("nan")

    tr = Trainer(mlp(), loader(n=64, batch_size=8), max_duration="20ba", device="cpu", log_interval="5ba",
                 save_folder=str(tmp_path), save_interval="4ba", algorithms=[Poison()])
    with pytest.raises(NonFiniteLossError) as err:
        tr.fit()
    msg = str(err.value)
    assert "between batches 6 and 8" in msg and "ep0-ba5.pt" not in msg
    assert err.value.last_checkpoint.endswith("ep0-ba4.pt")
    names = sorted(p.name for p in tmp_path.glob("*.pt"))
    assert names == ["ep0-ba4.pt"]   # the save due at batch 8 was refused


def test_no_host_sync_inside_training_steps(monkeypatch, tmp_path):
    """Tensor.item, Tensor.cpu and truth-testing raise inside steps that are not log points."""
    import sync_trap
    trap = sync_trap.install(monkeypatch)
    from hasten.algorithms import EMA
    tr = Trainer(mlp(dropout=0.1), loader(n=128, batch_size=8, shuffle=True), optimizers=_sgd, max_duration="2ep",
                 device="cpu", grad_clip_norm=1.0, grad_accum=2, log_interval="100ba",
                 schedulers=[LRSchedule("cosine", warmup="3ba")], algorithms=[trap, EMA(decay=0.9)],
                 callbacks=[ProgressBar(), SpeedMonitor(), LRMonitor()], loggers=[JSONLLogger(tmp_path / "m.jsonl")])
    tr.fit()
    assert trap.steps == 32
    assert tr.state.timestamp.batch == 32


def test_no_host_sync_with_nothing_listening_inside_the_step(monkeypatch, tmp_path):
    """The same trap with nothing listening inside the step (the leanest run of the one loop)."""
    import sync_trap
    from hasten.data.resumable import ResumableSampler
    trap = sync_trap.install(monkeypatch, quiet=True)
    # the trap is armed while the loader is asked for the next batch, so the loader must do its
    # host work at the start of an epoch (RandomSampler draws again when it runs out)
    x, y = classification_data(128)
    shuffled = DataLoader(TensorDataset(x, y), batch_size=8, sampler=ResumableSampler(128, shuffle=True))
    tr = Trainer(mlp(dropout=0.1), shuffled, optimizers=_sgd, max_duration="2ep",
                 device="cpu", log_interval="100ba", schedulers=[LRSchedule("cosine", warmup="3ba")],
                 callbacks=[trap, ProgressBar(), SpeedMonitor(), LRMonitor()], loggers=[JSONLLogger(tmp_path / "m.jsonl")])
    tr.fit()
    assert trap.steps == 30 and tr.state.timestamp.batch == 32   # all but the first batch of each epoch


class ListenInsideTheStep(Callback):
    """Does nothing, but listens inside the step."""
    def after_forward(self, state, logger):
        pass


def _per_sample_mse(outputs, targets):
    return ((outputs - F.one_hot(targets, outputs.shape[-1]).float()) ** 2).mean(dim=1)


@pytest.mark.parametrize("case", ["default", "per-sample-loss", "schedules", "bf16", "epochs+eval"])
def test_a_listener_inside_the_step_changes_nothing(case, tmp_path):
    """A callback listening inside the step (which does nothing) leaves the training as it
    is: same weights bit for bit, same clock, same logs."""
    kw = dict(max_duration="13ba", log_interval="4ba")
    if case == "per-sample-loss":
        kw["loss_fn"] = _per_sample_mse
    elif case == "schedules":
        kw.update(schedulers=[LRSchedule("cosine", warmup="3ba"),
                              lambda opt: torch.optim.lr_scheduler.StepLR(opt, 5, 0.5)])
    elif case == "bf16":
        kw["precision"] = "bf16-mixed"
    elif case == "epochs+eval":
        kw.update(max_duration="3ep", eval_dataloader=loader(n=32), eval_interval="5ba")

    def run(listen, name):
        torch.manual_seed(0)
        model = mlp(dropout=0.2)
        tr = Trainer(model, loader(n=48, batch_size=8, shuffle=True), optimizers=_sgd, device="cpu", seed=3,
                     callbacks=[ListenInsideTheStep()] if listen else [],
                     loggers=[JSONLLogger(tmp_path / f"{name}.jsonl")], **kw)
        tr.fit()
        tr.close()
        logs = [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
                for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        ts = tr.state.timestamp
        return model, (ts.epoch, ts.batch, ts.sample, ts.token), logs

    quiet, evented = run(False, "quiet"), run(True, "listened")
    for a, b in zip(quiet[0].parameters(), evented[0].parameters()):
        assert torch.equal(a, b)
    assert quiet[1] == evented[1]
    assert quiet[2] == evented[2] and len(quiet[2]) >= 4


def test_batch_ends_between_due_points_still_log_evaluate_and_stop_on_time(tmp_path):
    """Batch ends skip the interval checks until the next batch one can be due; the points
    where logging, evaluation and stopping happen stay where the intervals put them."""
    seen = {"log": [], "eval": []}

    class Watch(Callback):
        def batch_end(self, state, logger):
            if state.log_due:
                seen["log"].append(state.timestamp.batch)
            if state.timestamp.batch == 12:
                state.stop_training = True

        def eval_end(self, state, logger):
            seen["eval"].append(state.timestamp.batch)

    tr = Trainer(mlp(), loader(n=40, batch_size=8), optimizers=_sgd, device="cpu", max_duration="11ba",
                 log_interval="3ba", eval_dataloader=loader(n=16), eval_interval="5ba", callbacks=[Watch()])
    tr.fit()
    assert seen == {"log": [3, 6, 9], "eval": [5, 10, 11]}
    # a callback's stop request is honoured at the very batch it was made, between due points
    seen = {"log": [], "eval": []}
    tr = Trainer(mlp(), loader(n=40, batch_size=8), optimizers=_sgd, device="cpu", max_duration="100ba",
                 log_interval="50ba", callbacks=[Watch()])
    tr.fit()
    assert tr.state.timestamp.batch == 12 and seen["log"] == []


def test_schedule_matches_nanogpt_get_lr():
    """The cosine schedule in typed time reproduces nanoGPT's per-iteration formula."""
    lr, min_lr, warmup, total = 1e-3, 1e-4, 100, 2000

    def get_lr(it):  # nanoGPT train.py
        if it < warmup:
            return lr * (it + 1) / (warmup + 1)
        ratio = (it - warmup) / (total - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)

    seen = []

    class Spy(Algorithm):
        def batch_start(self, state, logger):
            seen.append(state.optimizer.param_groups[0]["lr"])

    from hasten.data import RandomWindows
    data = RandomWindows(torch.arange(100) % 7, block_size=4, batch_size=2)
    tiny = nn.Sequential(nn.Embedding(7, 4), nn.Linear(4, 7))
    Trainer(tiny, data, optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=lr), max_duration=f"{total}ba",
            schedulers=[LRSchedule("cosine", warmup=f"{warmup}ba", min_factor=min_lr / lr)], algorithms=[Spy()],
            device="cpu").fit()
    assert len(seen) == total
    for it in (0, 1, 50, 99, 100, 101, 1000, 1999):
        assert seen[it] == pytest.approx(get_lr(it), rel=1e-9), it


def test_schedule_in_epochs_survives_changing_epoch_lengths():
    sched = LRSchedule("linear", warmup="0ba", min_factor=0.0)
    assert sched.factor(0.5, 0.0) == pytest.approx(0.5)
    assert sched.factor(1.0, 0.0) == pytest.approx(0.0)
    wsd = LRSchedule("wsd", warmup="0.1dur", warmdown="0.2dur")
    assert wsd.factor(0.5, 0.1, 0.2) == 1.0 and wsd.factor(0.9, 0.1, 0.2) == pytest.approx(0.5)


def test_warmup_start_factor_gives_a_triangle():
    tri = LRSchedule("linear", warmup="0.25dur", start_factor=0.2, min_factor=0.1)
    assert tri.factor(0.0, 0.25) == pytest.approx(0.2)
    assert tri.factor(0.125, 0.25) == pytest.approx(0.6)
    assert tri.factor(0.25, 0.25) == pytest.approx(1.0)
    assert tri.factor(0.625, 0.25) == pytest.approx(0.55)
    assert tri.factor(1.0, 0.25) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="start_factor"):
        LRSchedule("linear", start_factor=1.5)


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match=r"precision.*Float8Training\(\)"):
        Trainer(mlp(), precision="fp8", device="cpu")
    with pytest.raises(ValueError, match="precision") as e:
        Trainer(mlp(), precision="fp64", device="cpu")
    assert "float8" not in str(e.value)
    with pytest.raises(ValueError, match="save_folder"):
        Trainer(mlp(), autoresume=True, device="cpu")
    with pytest.raises(ValueError, match="dur"):
        Trainer(mlp(), max_duration="0.5dur", device="cpu")
    with pytest.raises(ValueError, match="train_dataloader"):
        Trainer(mlp(), device="cpu").fit()


def test_max_duration_in_samples_and_tokens():
    tr = Trainer(mlp(), loader(n=64, batch_size=8), max_duration="20sp", device="cpu")
    tr.fit()
    assert tr.state.timestamp.batch == 3 and tr.state.timestamp.sample == 24
    from hasten.data import RandomWindows
    data = RandomWindows(torch.arange(200) % 7, block_size=5, batch_size=2)
    tiny = nn.Sequential(nn.Embedding(7, 4), nn.Linear(4, 7))
    tr = Trainer(tiny, data, max_duration="35tok", device="cpu")
    tr.fit()
    assert tr.state.timestamp.token == 40 and tr.state.timestamp.batch == 4


def test_precision_auto_follows_the_hardware():
    from hasten.hardware import cpu_has_bf16
    from hasten.runtime import resolve_precision
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu, frozenset({"avx2", "avx512f"})) == "fp32"          # bf16 would be emulated
    assert resolve_precision("auto", cpu, frozenset({"avx512f", "avx512_bf16"})) == "bf16-mixed"
    assert resolve_precision("auto", cpu, frozenset({"amx_bf16", "amx_tile"})) == "bf16-mixed"
    assert resolve_precision("fp32", cpu, frozenset({"amx_bf16"})) == "fp32"                 # explicit values win
    trainer = Trainer(nn.Linear(2, 2), device="cpu", precision="auto")
    expected = "bf16-mixed" if cpu_has_bf16() else "fp32"
    assert trainer.state.precision == expected
    assert (trainer.runtime.autocast_dtype is torch.bfloat16) == (expected == "bf16-mixed")


def test_a_cpu_capped_below_avx512_is_treated_as_without_bf16():
    """ONEDNN_MAX_CPU_ISA=AVX2 makes torch's oneDNN emulate bf16 on any chip, so 'auto' must
    give fp32, the tune must not offer bf16 and its cache key must differ from an uncapped
    run's, whatever the flags say (own process: oneDNN reads the cap once)."""
    import os
    import subprocess
    import sys
    code = ("import torch; from torch import nn; from hasten import Trainer; from hasten.hardware import cpu_has_bf16; "
            "from hasten.tune import bf16_fast, machine_key; "
            "print(cpu_has_bf16(), bf16_fast(), Trainer(nn.Linear(2, 2), device='cpu', precision='auto').state.precision, "
            "machine_key()['bf16_hardware'])")
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "fp32", "False"]   # the tune's cache key tells capped runs apart


def test_grad_clip_norm_is_one_gradient_clipping_algorithm_and_matches_torch():
    from hasten.algorithms import GradientClipping
    torch.manual_seed(0)
    model, twin = mlp(), mlp()
    twin.load_state_dict(model.state_dict())
    tr = Trainer(model, loader(), optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.5), max_duration="4ba",
                 device="cpu", grad_clip_norm=0.05)
    assert [type(a).__name__ for a in tr.state.algorithms] == ["GradientClipping"]
    tr.fit()
    opt = torch.optim.SGD(twin.parameters(), lr=0.5)
    for i, (x, y) in enumerate(loader()):
        if i == 4:
            break
        opt.zero_grad()
        F.cross_entropy(twin(x), y).backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.05)
        opt.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="not both"):
        Trainer(mlp(), loader(), device="cpu", grad_clip_norm=1.0, algorithms=[GradientClipping("norm", 1.0)])


def test_fp16_with_grad_clip_norm_and_another_clipping_algorithm_unscales_once():
    """Reported: fp16-mixed with GradientClipping and grad_clip_norm raised 'unscale_() has
    already been called on this optimizer since the last update()'."""
    from hasten.algorithms import GradientClipping
    tr = Trainer(mlp(), loader(), max_duration="3ba", device="cpu", precision="fp16-mixed", grad_clip_norm=1.0,
                 algorithms=[GradientClipping("adaptive", 0.01)])
    tr.fit()
    assert tr.state.timestamp.batch == 3


class _TokenModel(nn.Module):
    """Embedding -> linear head: (batch, time) ids -> (batch, time, vocab) logits."""

    def __init__(self, vocab=11, dim=6):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, vocab)

    def forward(self, x):
        return self.head(self.emb(x))


def _masked_tokens(n=12, t=5, vocab=11, seed=0):
    """Token batches whose targets are mostly the ignore index, unevenly across rows (as a
    masked-LM batch is): row i keeps i % 3 + 1 of its targets."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (n, t), generator=g)
    y = torch.randint(0, vocab, (n, t), generator=g)
    for i in range(n):
        y[i, i % 3 + 1:] = -100
    return x, y


@pytest.mark.parametrize("grad_accum,listen", [(1, False), (1, True), (3, False)])
def test_ignored_targets_count_nowhere_in_training_and_evaluation(grad_accum, listen):
    """The reduction over the targets that count equals F.cross_entropy(ignore_index=-100) on
    the whole batch: in the step's loss and gradient (micro-batches with unequal counts
    included) and in the evaluation loss."""
    x, y = _masked_tokens()
    torch.manual_seed(0)
    model, ref = _TokenModel(), _TokenModel()
    ref.load_state_dict(model.state_dict())
    loss = F.cross_entropy(ref(x).flatten(0, 1), y.flatten(), ignore_index=-100)
    loss.backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.5 * p.grad
    tr = Trainer(model, [(x, y)], optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.5), max_duration="1ba",
                 device="cpu", grad_accum=grad_accum, eval_dataloader=[(x[:7], y[:7]), (x[7:], y[7:])],
                 callbacks=[ListenInsideTheStep()] if listen else [], log_interval="1ba")
    tr.fit()
    assert tr.logger.latest["train/loss"] == pytest.approx(loss.item(), rel=1e-6)
    for a, b in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        true_val = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100).item()
    assert tr.state.eval_metrics["val/loss"] == pytest.approx(true_val, rel=1e-6)


def test_compile_mode_reaches_torch_compile_and_cuda_graph_modes_mark_every_step(tmp_path, monkeypatch):
    """trainer.compile_mode is torch.compile's mode; where it captures CUDA graphs (on a GPU) each
    training step, warm-up steps included, begins a new generation of the graphs' outputs
    (torch.compiler.cudagraph_mark_step_begin). Checked on the CPU with torch.compile stood in
    for, and the GPU rule forced."""
    from pathlib import Path

    import hasten.assembly.prepare as prepare
    from hasten.cli import main
    asked, marks = [], []
    monkeypatch.setattr(prepare.torch, "compile", lambda model, **kw: asked.append(kw) or model)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    tiny = Path(__file__).parent / "helpers" / "tiny_lm.yaml"
    code = main(["train", str(tiny), f"trainer.run_dir={tmp_path / 'run'}", "trainer.max_duration=2ba",
                 "trainer.eval_interval=2ba", "trainer.compile=true", "trainer.compile_mode=reduce-overhead",
                 "--no-progress"])
    assert code == 0 and asked == [{"dynamic": False, "mode": "reduce-overhead"}]
    assert marks == []   # on the CPU there are no CUDA graphs to mark
    t = Trainer(mlp(), loader(n=24, batch_size=8), max_duration="3ba", compile={"mode": "reduce-overhead"})
    assert t._graph_steps is False
    t._graph_steps = True   # what a CUDA device gives
    t.fit(summary=False)
    assert len(marks) == 1 + 3   # the warm-up's step on the batch's one shape, then 3 steps


def test_cuda_graph_modes_are_those_that_capture_graphs_and_only_on_cuda():
    from hasten.assembly.prepare import captures_cuda_graphs
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert captures_cuda_graphs({"mode": "reduce-overhead"}, cuda) and captures_cuda_graphs({"mode": "max-autotune"}, cuda)
    assert not captures_cuda_graphs({"mode": "reduce-overhead"}, cpu)
    assert not captures_cuda_graphs(True, cuda) and not captures_cuda_graphs({"mode": "max-autotune-no-cudagraphs"}, cuda)
    assert not captures_cuda_graphs({"mode": "default"}, cuda) and not captures_cuda_graphs(False, cuda)


def test_evaluation_under_cuda_graphs_copies_each_forwards_outputs_and_tta_reads_them(monkeypatch):
    """Under a CUDA-graph mode the evaluation forward copies its outputs out of the graphs'
    memory (a later call may overwrite them); test-time augmentation, which combines several
    forwards of a batch, goes through the copy and scores as without it. On the CPU, with the
    GPU rule forced and torch.compile stood in for."""
    import hasten.assembly.prepare as prepare
    from hasten.algorithms import TTA
    from hasten.assembly.prepare import CloneOutputs
    x = torch.randn(3, 4)
    out = CloneOutputs(lambda t: (t, {"a": t * 2, "n": 5}))(x)
    assert torch.equal(out[0], x) and out[0].data_ptr() != x.data_ptr() and out[1]["n"] == 5
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    data = [(torch.randn(6, 3, 8, 8), torch.randint(0, 3, (6,))) for _ in range(2)]
    results = {}
    for graphs in (False, True):
        monkeypatch.setattr(prepare, "captures_cuda_graphs", lambda compile, device: graphs)
        monkeypatch.setattr(prepare.torch, "compile", lambda model, **kw: model)
        model = nn.Sequential(*[m for m in conv])   # the same modules, the same weights
        t = Trainer(model, data, eval_dataloader=data, max_duration="1ba", compile={"mode": "reduce-overhead"},
                    algorithms=[TTA(flip=True, translate=1)], optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.0))
        assert isinstance(t._eval_model, CloneOutputs) is graphs
        results[graphs] = t.evaluate()
    assert results[True] == results[False]
