"""Compiled optimizer steps (trainer.compile_optimizer): the same updates as eager steps, one
compilation for a whole run whose schedule changes the learning rate every step, and
checkpoints that resume with or without it."""
import pytest
import torch
from torch import nn

from hasten import Callback, Trainer
from hasten.optim import LRSchedule
from hasten.optim.compiled import compile_steps, hold_lrs, lr_value, set_lr
from hasten.optim.muon import ConvMuon
from hasten.optim.sgdw import SGDW
from hasten.trainer import compiled_graphs

from tiny import loader, mlp


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 4 * 4, 16), nn.ReLU(), nn.Linear(16, 4))


def _optimizers(net):
    conv, hidden, head = net[0], net[2], net[4]
    return [ConvMuon([conv.weight, hidden.weight], lr=0.05, ns_steps=3, ns_dtype="fp32", weight_decay=0.01,
                     normalize_weights=True),
            torch.optim.AdamW([conv.bias, hidden.bias, head.bias], lr=3e-3, foreach=True),
            SGDW([head.weight], lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)]


def _train(compiled: bool, steps: int = 6):
    net = _net()
    opts = _optimizers(net)
    stepping = compile_steps(opts) if compiled else [o.step for o in opts]
    torch.manual_seed(1)
    xs, ys = torch.randn(steps, 5, 3, 6, 6), torch.randint(0, 4, (steps, 5))
    graphs = []
    for i in range(steps):
        for o in opts:
            for g in o.param_groups:   # a schedule: a new rate every step
                if "initial_lr" not in g:
                    g["initial_lr"] = lr_value(g)
                set_lr(g, g["initial_lr"] * (1 - i / steps))
        nn.functional.cross_entropy(net(xs[i]), ys[i]).backward()
        for s in stepping:
            s()
        for o in opts:
            o.zero_grad(set_to_none=True)
        graphs.append(compiled_graphs())
    return net, opts, graphs


def test_compiled_steps_equal_eager_steps_and_compile_once_while_the_rate_changes():
    eager, _, _ = _train(compiled=False)
    torch._dynamo.reset()
    compiled, opts, graphs = _train(compiled=True)
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert graphs[0] > 0, "the steps were not compiled"
    assert graphs[-1] == graphs[0], f"graphs compiled after the first step, as the rate changed: {graphs}"
    assert all(isinstance(g["lr"], torch.Tensor) and g["lr"].dim() == 0 for o in opts for g in o.param_groups)
    assert all(isinstance(g["initial_lr"], float) for o in opts for g in o.param_groups)


def test_learning_rates_held_as_tensors_and_back():
    net = _net()
    opts = _optimizers(net)
    hold_lrs(opts, as_tensors=True)
    t = opts[0].param_groups[0]["lr"]
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and float(t) == pytest.approx(0.05)
    set_lr(opts[0].param_groups[0], 0.02)
    assert opts[0].param_groups[0]["lr"] is t and float(t) == pytest.approx(0.02)   # in place: the graph's input
    hold_lrs(opts, as_tensors=True)
    assert opts[0].param_groups[0]["lr"] is t                                        # kept, not replaced
    hold_lrs(opts, as_tensors=False)
    assert opts[0].param_groups[0]["lr"] == pytest.approx(0.02) and isinstance(opts[0].param_groups[0]["lr"], float)


def _trainer(compile_optimizer, **kw):
    torch.manual_seed(0)
    model = mlp()
    return Trainer(model, loader(n=48, batch_size=8), max_duration="6ba", seed=0, device="cpu",
                   optimizers=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True),
                   schedulers=[LRSchedule("cosine", warmup="2ba")], compile_optimizer=compile_optimizer, **kw)


def test_trainer_compile_optimizer_matches_the_eager_run_and_its_checkpoint_resumes_eagerly(tmp_path):
    eager = _trainer(False)
    eager.fit(summary=False)
    torch._dynamo.reset()
    before = compiled_graphs()
    compiled = _trainer(True, save_folder=str(tmp_path / "ck"), save_interval="3ba")
    compiled.fit(summary=False)
    assert compiled_graphs() > before
    assert compiled.state.compile_graphs_after_warmup == 0   # every graph in the first step (the warm-up)
    for a, b in zip(eager.state.model.parameters(), compiled.state.model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    assert compiled.state.lr() == pytest.approx(eager.state.lr())   # a number for logs and the progress bar
    # the compiled run's checkpoint (learning rates saved as tensors) resumes in an eager run
    resumed = Trainer(mlp(), loader(n=48, batch_size=8), max_duration="6ba", seed=0, device="cpu",
                      optimizers=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, fused=False, foreach=True),
                      schedulers=[LRSchedule("cosine", warmup="2ba")], load_path=str(tmp_path / "ck" / "ep0-ba3.pt"))
    resumed.fit(summary=False)
    assert resumed.state.timestamp.batch == 6
    assert all(isinstance(g["lr"], float) for g in resumed.state.optimizers[0].param_groups)
    for a, b in zip(eager.state.model.parameters(), resumed.state.model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_compile_optimizer_is_refused_with_fp16_loss_scaling_in_one_line():
    with pytest.raises(ValueError, match="compile_optimizer with fp16-mixed"):
        Trainer(mlp(), loader(n=16, batch_size=8), max_duration="1ba", device="cpu", precision="fp16-mixed",
                compile_optimizer=True)
    with pytest.raises(TypeError, match="compile_optimizer="):
        Trainer(mlp(), loader(n=16, batch_size=8), max_duration="1ba", device="cpu", compile_optimizer="yes")


def test_a_fused_optimizer_is_left_eager_with_a_warning_and_recipes_build_the_foreach_form():
    net = _net()
    with pytest.warns(UserWarning, match="fused"):
        compile_steps([torch.optim.AdamW(net.parameters(), lr=1e-3, fused=True)])
    from hasten.optim.factory import build_optimizer
    from hasten.config import load_recipe
    from hasten.errors import ConfigError
    from hasten.runtime import make_runtime
    from hasten.models import GPT, GPTConfig
    gpt, rt = GPT(GPTConfig(n_layer=1)), make_runtime(device="cpu")
    for compiled, fused in ((False, True), (True, False)):
        recipe = load_recipe("shakespeare-char-fast", [f"trainer.compile_optimizer={str(compiled).lower()}"])
        adam = build_optimizer(recipe.optimizer, gpt, rt, compiled=compiled)[-1]
        assert isinstance(adam, torch.optim.AdamW) and bool(adam.param_groups[0]["fused"]) is fused
    recipe = load_recipe("shakespeare-char-fast", ["trainer.compile_optimizer=true", "optimizer.fused=true"])
    with pytest.raises(ConfigError, match="optimizer.fused=true with trainer.compile_optimizer"):
        build_optimizer(recipe.optimizer, gpt, rt, compiled=True)


def _speedrun(compile_optimizer):
    from hasten.algorithms import ChannelsLast, PatchWhitening
    from hasten.data import DeviceLoader
    from hasten.models.speedrun import SpeedrunNet
    from hasten.optim.muon import muon_for, split_for_muon

    def optimizers(m):
        hidden, other = split_for_muon(m)
        return [muon_for([p for _, p in hidden], 0.05, normalize_weights=True, ns_steps=3, ns_dtype="fp32"),
                torch.optim.SGD([p for _, p in other], lr=0.05, momentum=0.85, nesterov=True, weight_decay=5e-3,
                                foreach=True)]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 256, (48, 16, 16, 3), dtype=torch.uint8, generator=g), torch.arange(48) % 10
    torch.manual_seed(0)
    whitening = PatchWhitening(num_images=32, train_bias_for="1ep")
    t = Trainer(SpeedrunNet(widths=(8, 8, 8)), DeviceLoader(x, y, 16, mean=(128,) * 3, std=(64,) * 3, drop_last=True),
                max_duration="3ep", optimizers=optimizers, device="cpu", seed=0, compile_optimizer=compile_optimizer,
                algorithms=[whitening, ChannelsLast()])
    return t, whitening


def test_the_whitening_bias_stops_without_compiling_the_optimizer_step_again():
    """Patch whitening's bias stopping part-way would take a gradient away from a compiled
    step (a guard: the step would compile again inside timed training); under compiled steps it
    keeps a zeroed gradient and its value is put back after each step, which leaves it where it
    stopped and every other parameter where the eager run (bias taken out of autograd) puts it."""
    eager, _ = _speedrun(False)
    eager.fit(summary=False)
    torch._dynamo.reset()
    compiled, whitening = _speedrun(True)
    stopped_at = {}

    class Watch(Callback):
        def batch_end(self, state, logger):
            if whitening.bias_stopped and "bias" not in stopped_at:
                stopped_at["bias"] = whitening._conv.bias.detach().clone()
    compiled.add_callbacks(Watch())
    compiled.fit(summary=False)
    assert compiled.state.compile_graphs_after_warmup == 0
    assert whitening.bias_stopped and whitening._conv.bias.requires_grad
    assert torch.equal(whitening._conv.bias.detach(), stopped_at["bias"])
    for (name, a), b in zip(eager.state.model.named_parameters(), compiled.state.model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)


def test_before_torch_2_13_loop_reordering_is_off_for_the_step_graphs_alone(monkeypatch):
    # torch 2.11 on CUDA stopped compiling the speedrun's SGD/Muon steps with an AssertionError in
    # inductor's loop reordering after fusion (2.13 skips the node instead): before 2.13 the steps
    # compile with it off, unless the caller chose options or a mode; the updates are unchanged
    import hasten.optim.compiled as compiled
    seen = []
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or real(fn, **kw))
    monkeypatch.setattr(compiled, "_torch_version", lambda: (2, 11))
    net = _net()
    eager_net = _net()
    steps = compile_steps(_optimizers(net))
    assert seen and all(kw == {"options": {"loop_ordering_after_fusion": False}} for kw in seen)
    eager = _optimizers(eager_net)
    x = torch.randn(6, 3, 6, 6)
    for _ in range(2):
        for m, opts in ((net, None), (eager_net, eager)):
            m.zero_grad()
            m(x).square().mean().backward()
            for step in (steps if opts is None else [o.step for o in opts]):
                step()
    for a, b in zip(net.parameters(), eager_net.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    seen.clear()
    compile_steps(_optimizers(_net()), mode="max-autotune-no-cudagraphs")
    assert seen and all(kw == {"mode": "max-autotune-no-cudagraphs"} for kw in seen)
    seen.clear()
    monkeypatch.setattr(compiled, "_torch_version", lambda: (2, 13))
    compile_steps(_optimizers(_net()))
    assert seen and all(kw == {} for kw in seen)
