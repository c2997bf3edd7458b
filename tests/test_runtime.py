"""The runtime: resolved once, before the model; read by the task, the optimizers and the Trainer."""
import io
import pytest
import torch
import torch.nn as nn

from hasten import Trainer, make_runtime
from hasten.runtime import Runtime

from tiny import loader, mlp


def test_make_runtime_resolves_everything_and_seeds_the_model_built_after_it():
    rt = make_runtime(device="cpu", precision="auto", seed=7)
    assert isinstance(rt, Runtime) and rt.device == torch.device("cpu")
    assert rt.precision in ("fp32", "bf16-mixed") and rt.asked_precision == "auto"
    a = nn.Linear(4, 4).weight.detach().clone()
    make_runtime(device="cpu", seed=7)
    b = nn.Linear(4, 4).weight.detach().clone()
    assert torch.equal(a, b)
    for bad, match in ((dict(precision="fp8"), "precision"), (dict(seed=-1), "seed"),
                       (dict(threads=0), "threads"), (dict(host_allocator="fast"), "host_allocator"),
                       (dict(device="tpu"), "device")):
        with pytest.raises(ValueError, match=match):
            make_runtime(**bad)


def test_a_model_factory_is_built_under_the_seed_and_equals_a_model_built_after_make_runtime():
    t1 = Trainer(lambda: mlp(), loader(), max_duration="1ba", seed=3, device="cpu")
    make_runtime(device="cpu", seed=3)
    direct = mlp()
    for p, q in zip(t1.state.model.parameters(), direct.parameters()):
        assert torch.equal(p, q)


def test_runtime_and_its_parts_are_not_both_given():
    rt = make_runtime(device="cpu")
    with pytest.raises(ValueError, match="runtime= or precision"):
        Trainer(mlp(), loader(), runtime=rt, precision="fp32")
    tr = Trainer(mlp(), loader(), runtime=rt, max_duration="1ba")
    assert tr.state.runtime is rt and tr.device == rt.device and tr.state.precision == rt.precision
    with pytest.raises(TypeError, match="torch.nn.Module"):
        Trainer(lambda: 3, loader(), runtime=rt)


def test_the_training_stream_does_not_depend_on_randomness_drawn_while_building():
    """The Trainer reseeds at construction: dropout masks match whatever the model's
    construction drew."""
    def run(extra_draws):
        rt = make_runtime(device="cpu", seed=5)
        torch.rand(extra_draws)   # e.g. a model whose construction draws more
        torch.manual_seed(0)
        model = mlp(dropout=0.5)
        tr = Trainer(model, loader(n=16, batch_size=8), runtime=rt, max_duration="2ba",
                     optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
        tr.fit()
        return [p.detach().clone() for p in model.parameters()]
    for p, q in zip(run(0), run(1000)):
        assert torch.equal(p, q)


def test_fp32_runtime_gives_muon_an_fp32_iteration_and_bf16_a_bf16_one():
    from hasten.optim.factory import build_optimizer
    from hasten.config import OptimizerConfig
    from hasten.models.gpt import GPT, GPTConfig
    from hasten.optim import ConvMuon
    cfg = OptimizerConfig(name="muon")
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=11, block_size=8))
    fp32 = build_optimizer(cfg, model, Runtime(torch.device("cpu"), "fp32", 0, 1, "default"))[0]
    bf16 = build_optimizer(cfg, model, Runtime(torch.device("cpu"), "bf16-mixed", 0, 1, "default"))[0]
    assert isinstance(fp32, ConvMuon) and fp32.param_groups[0]["ns_dtype"] == "fp32"
    assert type(bf16) is torch.optim.Muon   # torch's own, whose iteration is bf16
    cfg.muon.ns_dtype = "bf16"   # set outright, it wins
    assert type(build_optimizer(cfg, model, Runtime(torch.device("cpu"), "fp32", 0, 1, "default"))[0]) is torch.optim.Muon


def test_the_task_reads_the_runtime_device():
    from hasten.config import load_recipe
    from hasten.tasks import TASKS
    recipe = load_recipe("shakespeare-char-baseline", ["trainer.device=cpu", "data.eval_tokens=200"])
    built = TASKS[recipe.task].build(recipe, make_runtime(device="cpu", seed=recipe.trainer.seed))
    assert built.train_dataloader.seed == recipe.trainer.seed


def test_timed_segments_end_with_the_device_work_done(monkeypatch):
    """A fake device: each training step costs 1 s of host time and leaves 10 s of work
    queued on the device; synchronising waits for it. The training clock must include the
    queued work at every point it is read (log points, evaluations, the end), and the
    evaluation's own time must not; no synchronisation happens inside steps."""
    import time
    from dataclasses import dataclass

    from hasten.bench.recording import BenchRecorder

    clock = {"now": 0.0, "queued": 0.0, "syncs": []}
    monkeypatch.setattr(time, "perf_counter", lambda: clock["now"])

    def sync():
        clock["syncs"].append(clock["now"])
        clock["now"] += clock["queued"]
        clock["queued"] = 0.0

    @dataclass(frozen=True)
    class FakeDeviceRuntime(Runtime):
        @property
        def device_synchronize(self):
            return sync

    model = mlp()

    def step_cost(module, inputs, output):
        clock["now"] += 1.0                      # host time of the step
        if module.training:
            clock["queued"] = 10.0               # the device lags behind

    model.register_forward_hook(step_cost)
    rt = FakeDeviceRuntime(torch.device("cpu"), "fp32", 0, 1, "default")
    out = io.StringIO()   # the record file
    tr = Trainer(model, loader(n=48, batch_size=8), runtime=rt, max_duration="6ba", log_interval="3ba",
                 eval_interval="3ba", eval_dataloader=loader(n=16, batch_size=8), callbacks=[BenchRecorder(out)])
    tr.fit()
    import json
    rows = [json.loads(s) for s in out.getvalue().splitlines()]
    progress = [r["train_s"] for r in rows if r["kind"] == "progress"]
    evals = [(r["train_s"], r["eval_s"]) for r in rows if r["kind"] == "eval"]
    assert progress == [13.0, 26.0]                  # 3 steps of 1 s + the 10 s queued, twice
    assert evals == [(13.0, 2.0), (26.0, 2.0)]       # evaluation: its own 2 batches, nothing queued
    assert tr.state.timestamp.train_seconds == 26.0
    # two segment ends, both edges of both evaluations, the end of fit: never inside a step
    assert clock["syncs"] == [3.0, 13.0, 15.0, 18.0, 28.0, 30.0, 30.0]


def test_make_runtime_prepares_the_resolved_device_before_seeding(monkeypatch):
    import hasten.runtime as runtime_mod
    calls = []
    monkeypatch.setattr(runtime_mod, "prepare_device", lambda dev: calls.append((dev, torch.initial_seed())))
    torch.manual_seed(123)
    make_runtime(device="cpu", seed=5)
    assert calls == [(torch.device("cpu"), 123)]   # once, with the device, before the run's seed


def test_prepare_device_does_nothing_off_cuda_and_on_cuda_runs_a_product_in_fp32_and_fp64(monkeypatch):
    import contextlib
    from hasten.runtime import prepare_device

    def no_cuda(*a, **k):
        raise AssertionError("touched CUDA")

    monkeypatch.setattr(torch.cuda, "synchronize", no_cuda)
    prepare_device(torch.device("cpu"))            # nothing queued, nothing to prepare
    # the CUDA branch, with CUDA stood in for by the CPU: products in both dtypes, then a wait
    seen, synced = [], []
    real_ones = torch.ones

    def ones_here(*shape, device=None, dtype=None):
        seen.append((device, dtype))
        return real_ones(*shape, dtype=dtype)

    monkeypatch.setattr(torch, "ones", ones_here)
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: synced.append(dev))
    prepare_device(torch.device("cuda", 0))
    assert [d for _, d in seen] == [torch.float32, torch.float64]
    assert all(dev == torch.device("cuda", 0) for dev, _ in seen) and synced == [torch.device("cuda", 0)]
