"""hasten.compress against independent references: torch's own pruning, the model with the
removed units' weights zeroed, a closed-form schedule, fp32 outputs; artifacts and the
`hasten compress` / `hasten eval` commands end to end on a tiny GPT."""
import json
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.utils.prune as prune

import hasten.compress as hc
import hasten.functional as hf
from hasten import Trainer
from hasten.compress.artifact import pack_sparse, read_artifact, save_artifact, unpack_sparse
from hasten.compress.pipeline import evaluate_artifact
from hasten.compress.structured import speedrun_channel_scores
from hasten.errors import CheckpointError
from hasten.models import GPT, GPTConfig, SpeedrunNet

from tiny import run_cli


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.Flatten(), nn.Linear(16 * 28 * 28, 32),
                         nn.ReLU(), nn.Linear(32, 10))


# ---------------------------------------------------------------------------- unstructured
def test_global_pruning_gives_torchs_global_unstructured_masks_also_for_channels_last_weights():
    ours, ref = _net(), _net()
    layers = hc.prunable_weights(ours)
    assert [n for n, _ in layers] == ["2", "4"]          # stem and head stay dense by default
    ours[2].weight.data = ours[2].weight.data.contiguous(memory_format=torch.channels_last)
    hc.global_magnitude_prune(ours, 0.6)
    prune.global_unstructured([(ref[2], "weight"), (ref[4], "weight")], prune.L1Unstructured, amount=0.6)
    assert torch.equal(ours[2].weight_mask, ref[2].weight_mask) and torch.equal(ours[4].weight_mask, ref[4].weight_mask)
    # pruning further counts what is already pruned: 0.8 of all targets, as torch's container does
    hc.global_magnitude_prune(ours, 0.8)
    n = ref[2].weight.numel() + ref[4].weight.numel()
    prune.global_unstructured([(ref[2], "weight"), (ref[4], "weight")], prune.L1Unstructured,
                              amount=round(0.8 * n) - round(0.6 * n))
    assert torch.equal(ours[4].weight_mask, ref[4].weight_mask)
    zeros = sum(int((m.weight == 0).sum()) for _, m in layers)
    assert zeros == round(0.8 * n)


def test_layer_pruning_gives_torchs_l1_unstructured_per_layer_and_permanent_keeps_outputs():
    ours, ref = _net(), _net()
    hc.layer_magnitude_prune(ours, 0.5)
    for i in (2, 4):
        prune.l1_unstructured(ref[i], "weight", amount=0.5)
        assert torch.equal(ours[i].weight_mask, ref[i].weight_mask)
    x = torch.randn(2, 3, 32, 32)
    masked = ours(x)
    hc.make_permanent(ours)
    assert not hc.is_pruned(ours) and set(ours.state_dict()) == set(_net().state_dict())
    torch.testing.assert_close(ours(x), masked, rtol=0, atol=0)
    total, nonzero = hc.count_parameters(ours)
    assert total == sum(p.numel() for p in _net().parameters())
    assert total - nonzero == ours[2].weight.numel() // 2 + ours[4].weight.numel() // 2


@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5, "half"])
def test_a_sparsity_outside_zero_one_is_refused(bad):
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        hc.global_magnitude_prune(_net(), bad)


# ---------------------------------------------------------------------------- structured
def _zero_inputs(w: torch.Tensor, keep: torch.Tensor) -> None:
    drop = torch.ones(w.shape[1], dtype=torch.bool)
    drop[keep] = False
    w.data[:, drop] = 0


def test_structured_speedrun_equals_the_full_network_with_the_removed_channels_unread():
    torch.manual_seed(0)
    big = SpeedrunNet(widths=(16, 32, 32), logit_scale=0.5, act="relu").eval()
    with torch.no_grad():   # batch-norm statistics that are not trivial
        for m in big.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5), m.running_var.uniform_(0.5, 2), m.weight.uniform_(0.5, 1.5), m.bias.uniform_(-0.2, 0.2)
    x = torch.randn(4, 3, 32, 32)
    small, changes = hc.prune_structured(big, 0.25, inputs=x)
    assert type(small) is SpeedrunNet and changes == {"widths": [12, 24, 24]}
    assert sum(p.numel() for p in small.parameters()) < 0.6 * sum(p.numel() for p in big.parameters())
    # reference: the big network computes the same when every layer that reads a removed channel ignores it
    scores = speedrun_channel_scores(big, x)
    ref = SpeedrunNet(widths=(16, 32, 32), logit_scale=0.5, act="relu").eval()
    ref.load_state_dict(big.state_dict())
    groups = list(ref.groups)
    for gi, g in enumerate(groups):
        k = changes["widths"][gi]
        keep1 = scores[2 * gi].topk(k).indices
        keep2 = scores[2 * gi + 1].topk(k).indices
        _zero_inputs(g[4].weight, keep1)
        _zero_inputs(groups[gi + 1][0].weight if gi + 1 < 3 else ref.head.weight, keep2)
    torch.testing.assert_close(small.eval()(x), ref(x), rtol=1e-4, atol=1e-5)


def test_structured_kept_counts_are_multiples_in_large_layers_and_exact_elsewhere():
    from hasten.compress.structured import kept
    # cifar10-fast's widths at 30%: the nearest multiples of 16 to 44.8 and 179.2
    assert [kept(n, 0.3, 16) for n in (64, 256, 256)] == [48, 176, 176]
    assert [kept(n, 0.3, 1) for n in (64, 256, 256)] == [45, 179, 179]          # exactly the fraction
    assert kept(32, 0.3, 16) == 22                                               # under 4 x 16 units: exact
    assert kept(256, 0.02, 16) == 240                                            # asked to prune: one multiple goes
    assert kept(256, 0.0, 16) == 256 and kept(64, 0.99, 16) == 16               # nothing asked; at least one multiple
    assert kept(100, 0.5, 16) == 48                                              # 50 -> the nearest multiple
    with pytest.raises(ValueError, match="whole number >= 1"):
        kept(64, 0.3, 0)


def test_structured_speedrun_widths_follow_multiple_of_and_keep_the_filters_of_highest_score():
    torch.manual_seed(0)
    big = SpeedrunNet(widths=(64, 128, 128)).eval()
    x = torch.randn(2, 3, 32, 32)
    aligned, changes = hc.prune_structured(big, 0.3, inputs=x)                     # default multiple_of=16
    exact, changes1 = hc.prune_structured(big, 0.3, inputs=x, multiple_of=1)
    assert changes == {"widths": [48, 96, 96]} and changes1 == {"widths": [45, 90, 90]}
    # each keeps the first conv's filters of highest score, by the scores recomputed here
    scores = speedrun_channel_scores(big, x)
    w = big.groups[0][0].weight
    for small, k in ((aligned, 48), (exact, 45)):
        top = sorted(scores[0].topk(k).indices.tolist())
        assert torch.equal(small.groups[0][0].weight, w[top])


def test_structured_scores_find_channels_nobody_reads():
    torch.manual_seed(0)
    net = SpeedrunNet(widths=(8, 16, 16)).eval()
    with torch.no_grad():
        net.groups[0][4].weight[:, [1, 5]] = 0          # conv 2 of group 0 ignores channels 1 and 5 of conv 1
    _, changes = hc.prune_structured(net, 0.25, inputs=torch.randn(2, 3, 32, 32))
    from hasten.compress.structured import _top
    keep = _top(speedrun_channel_scores(net, torch.randn(2, 3, 32, 32))[0], 6)
    assert 1 not in keep.tolist() and 5 not in keep.tolist()


def test_structured_gpt_equals_the_full_model_with_the_removed_units_and_heads_unread():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=17, block_size=8, n_layer=2, n_head=4, n_embd=32, qk_norm=True, mlp="relu2")
    big = GPT(cfg).eval()
    idx = torch.randint(0, 17, (3, 8))
    small, changes = hc.prune_structured(big, 0.25, inputs=idx)
    assert type(small) is GPT and changes == {"mlp_hidden": 96, "n_head": 3, "head_dim": 8}
    assert small.config.n_embd == 32 and small.lm_head.weight is small.wte.weight   # still tied
    mlp_scores, head_scores = hc.structured.transformer_unit_scores(big, idx)
    ref = GPT(cfg).eval()
    ref.load_state_dict(big.state_dict())
    for i, b in enumerate(ref.blocks):
        _zero_inputs(b.mlp.proj.weight, mlp_scores[i].topk(96).indices)
        heads = head_scores[i].topk(3).indices
        cols = (heads[:, None] * 8 + torch.arange(8)).reshape(-1)
        _zero_inputs(b.attn.proj.weight, cols)
    torch.testing.assert_close(small(idx), ref(idx), rtol=1e-4, atol=1e-5)


def test_structured_pruning_refuses_a_resnet_in_one_line():
    from hasten.models import ResNet9
    with pytest.raises(ValueError, match="SpeedrunNet, GPT and BERT, not ResNet9"):
        hc.prune_structured(ResNet9(width=8), 0.3)


# ---------------------------------------------------------------------------- quantization
def test_int8_quantization_of_linear_layers_stays_close_to_fp32():
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=17, block_size=16, n_layer=1, n_head=2, n_embd=64)).eval()
    idx = torch.randint(0, 17, (4, 16))
    ref = model(idx)
    for mode in ("int8", "int8-weight"):
        q = GPT(model.config).eval()
        q.load_state_dict(model.state_dict())
        assert hc.quantize_linear(q, mode) == 4 + 1      # qkv, proj, fc, proj; the (untied copy of the) head
        out = q(idx)
        assert (out - ref).abs().max() < 0.05 * ref.abs().max()
        assert (out.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


@pytest.mark.slow
def test_int8_static_for_convolutions_agrees_with_fp32():
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    net = SpeedrunNet(widths=(16, 32, 32), logit_scale=1.0, head_std=1.0, act="relu").eval()
    x = torch.randn(64, 3, 32, 32)
    q = hc.quantize_static(net, [x])
    out, ref = q(x[:5]), net(x[:5])                         # any batch size, not only the calibration's
    assert out.shape == ref.shape and (out - ref).abs().max() < 0.08 * ref.abs().max()
    assert torch.corrcoef(torch.stack([out.flatten(), ref.flatten()]))[0, 1] > 0.99


def test_on_a_cpu_with_bf16_the_model_before_is_also_timed_under_bf16_autocast(monkeypatch):
    import types
    from hasten.compress import pipeline
    from hasten.compress.measure import Autocast, best, inference_cost
    net, x = _net().eval(), torch.randn(2, 3, 32, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = net(x)
    with torch.no_grad():
        out = Autocast(net)(x)
        assert out.dtype == torch.bfloat16 and torch.equal(out, ref)   # torch's autocast, not fp32's arithmetic
        assert not torch.equal(out.float(), net(x))
    task = types.SimpleNamespace(example_inputs=lambda built, b: torch.randn(b, 3, 32, 32))
    monkeypatch.setattr(pipeline, "TASKS", {"t": task})
    monkeypatch.setattr(pipeline, "inference_cost", lambda models, make, batches, repeats:
                        inference_cost(models, make, batches, repeats=repeats, paths=("eager",)))
    session = types.SimpleNamespace(recipe=types.SimpleNamespace(task="t", data=types.SimpleNamespace(eval_batch_size=3)),
                                    built=None)
    after = _net(1).eval()
    record = {"metric": "val/acc", "before": {"val/acc": 0.5}, "after": {"val/acc": 0.5},
              "parameters": {"before": 1, "after": 1, "nonzero_before": 1, "nonzero_after": 1},
              "bytes": {"dense_fp32": 1, "artifact": 1}, "source": {"recipe": "r", "checkpoint": "c"},
              "compression": {"steps": [], "quantize": None}, "cpu": {"name": "cpu", "int8_hardware": "none", "flags": []},
              "threads": 1, "torch": torch.__version__, "code": {}}
    for has_bf16 in (True, False):
        monkeypatch.setattr(pipeline, "cpu_has_bf16", lambda: has_bf16)
        rows = pipeline.measure_cost(net, after, session, None, 1, lambda *a: None)
        models = {(r["model"], r["batch"]) for r in rows}
        expect = {"before", "after"} | ({pipeline.BF16_REFERENCE} if has_bf16 else set())
        assert models == {(m, b) for m in expect for b in (1, 3, 64)}
        table = [line for line in pipeline.render({**record, "inference": rows}).splitlines() if line.startswith("| ")]
        head = next(t for t in table if t.startswith("| batch"))
        assert ("before in bf16: eager" in head) == has_bf16 and ("speedup vs bf16" in head) == has_bf16
        row = next(t for t in table if t.startswith("| 3 |"))
        assert row.count("|") == head.count("|")
        fastest = best(rows)
        ratio = fastest[(pipeline.BF16_REFERENCE if has_bf16 else "before", 3)]["median_s"] / fastest[("after", 3)]["median_s"]
        assert row.rstrip(" |").endswith(f"{ratio:.2f}x")


def test_a_missing_torchao_is_named_with_the_fix(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_torchao(name, *a, **k):
        if name == "torchao" or name.startswith("torchao."):
            raise ImportError("no torchao")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_torchao)
    with pytest.raises(ImportError, match=r"pip install 'hasten\[compress\]'"):
        hc.quantize.check_mode("int8")
    with pytest.raises(ValueError, match="unknown quantization"):
        hc.quantize.check_mode("int4")


# ---------------------------------------------------------------------------- artifacts
def test_sparse_storage_round_trips_exactly_and_shrinks_the_file(tmp_path):
    torch.manual_seed(0)
    w = torch.randn(256, 128)
    w[torch.rand_like(w) < 0.5] = 0
    packed = pack_sparse(w)
    assert isinstance(packed, dict) and torch.equal(unpack_sparse(packed), w)
    dense = tmp_path / "dense.pt"
    torch.save({"w": w}, dense)
    size = save_artifact(tmp_path / "a.hasten", {"w": w, "b": torch.randn(7)}, {"x": 1, "recipe": {}})
    assert size < 0.6 * dense.stat().st_size
    weights, meta, calib = read_artifact(tmp_path / "a.hasten")
    assert torch.equal(weights["w"], w) and meta == {"x": 1, "recipe": {}} and calib is None
    assert pack_sparse(torch.randn(256, 128)).__class__ is torch.Tensor    # dense stays dense
    q = torch.randint(-128, 128, (64, 32), dtype=torch.int8)
    q[torch.rand(64, 32) < 0.6] = 0                                         # int8 weights of a pruned layer pack too
    assert isinstance(pack_sparse(q), dict) and torch.equal(unpack_sparse(pack_sparse(q)), q)
    save_artifact(tmp_path / "old.hasten", {"w": w}, {"recipe": {}}, calibration=[torch.ones(2, 3)])   # the older int8-static form
    assert torch.equal(read_artifact(tmp_path / "old.hasten")[2]["calibration"][0], torch.ones(2, 3))


@pytest.mark.slow
def test_int8_static_state_rebuilds_the_same_graph_from_a_fresh_model(tmp_path):
    """An int8-static artifact stores the int8 graph's tensors and numbers, not float weights and
    batches: put back into the graph a freshly built model quantizes to, they compute exactly
    what the saved graph did, and the file is a fraction of the float weights'."""
    pytest.importorskip("torchao")
    from hasten.compress.quantize import put_static_state, quantize_static_from, static_state
    torch.manual_seed(0)
    net = SpeedrunNet(widths=(16, 32, 32), logit_scale=1.0, head_std=1.0, act="relu").eval()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1), m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(64, 3, 32, 32)
    saved = hc.quantize_static(net, [x])
    size = save_artifact(tmp_path / "q.hasten", {}, {}, static=static_state(saved))
    torch.save(net.state_dict(), tmp_path / "fp32.pt")
    assert size < 0.4 * (tmp_path / "fp32.pt").stat().st_size
    weights, _, static = read_artifact(tmp_path / "q.hasten")
    assert weights == {} and all(t.dtype != torch.float32 or t.dim() < 2 for t in static["tensors"].values())
    torch.manual_seed(1)
    fresh = SpeedrunNet(widths=(16, 32, 32), logit_scale=1.0, head_std=1.0, act="relu").eval()   # other weights
    y = torch.randn(5, 3, 32, 32)
    assert not torch.allclose(fresh(y), net(y), atol=0.1)
    loaded = quantize_static_from(fresh, torch.randn(2, 3, 32, 32), static)
    assert torch.equal(loaded(y), saved(y))
    wrong = {"tensors": {**static["tensors"], "_frozen_param1": static["tensors"]["_frozen_param1"][:-1]},
             "numbers": static["numbers"]}                                  # as from a model one unit narrower
    with pytest.raises(ValueError, match="_frozen_param1: stored"):
        put_static_state(loaded, wrong)
    assert torch.equal(loaded(y), saved(y))                                 # refused before anything changed


def test_corrupt_truncated_foreign_and_code_carrying_files_get_one_line_errors(tmp_path):
    good = tmp_path / "good.hasten"
    save_artifact(good, {"w": torch.randn(10)}, {})
    data = good.read_bytes()
    (tmp_path / "trunc.hasten").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.hasten").write_bytes(b"not a model")
    torch.save({"a": torch.zeros(1)}, tmp_path / "foreign.hasten")
    import pickle

    class Boom:
        def __reduce__(self):
            return (print, ("code ran",))
    with open(tmp_path / "evil.hasten", "wb") as f:
        pickle.dump(Boom(), f)
    for name in ("trunc", "junk", "foreign", "evil", "missing"):
        with pytest.raises(CheckpointError) as e:
            read_artifact(tmp_path / f"{name}.hasten")
        assert "\n" not in str(e.value).strip()


# ---------------------------------------------------------------------------- gradual pruning
def test_cubic_schedule_matches_the_closed_form():
    assert hf.cubic_sparsity(0.05, 0.8, start=0.1, end=0.5) == 0.0
    assert hf.cubic_sparsity(0.1, 0.8, start=0.1, end=0.5) == 0.0
    assert hf.cubic_sparsity(0.3, 0.8, start=0.1, end=0.5) == pytest.approx(0.8 * (1 - 0.5 ** 3))
    assert hf.cubic_sparsity(0.9, 0.8, start=0.1, end=0.5) == pytest.approx(0.8)


def _gradual_trainer(tmp_path, duration, load=None, save=True):
    from tiny import classification_data
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
    x, y = classification_data(256, 8, 3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    return Trainer(model=model, train_dataloader=loader, max_duration=duration, eval_interval="100ep",
                   optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                   algorithms=[hc.GradualPruning(sparsity=0.75, start="2ba", end="12ba", interval="2ba")],
                   save_folder=str(tmp_path / "ck") if save else None, save_interval="8ba", load_path=load)


def test_gradual_pruning_reaches_its_sparsity_and_resumes_exactly_masks_included(tmp_path):
    straight = _gradual_trainer(tmp_path / "a", "16ba", save=False)
    straight.fit()
    m = straight.state.model
    zeros = int((m[0].weight == 0).sum() + (m[2].weight == 0).sum())     # the targets: all but the head
    assert zeros == round(0.75 * (m[0].weight.numel() + m[2].weight.numel()))
    first = _gradual_trainer(tmp_path / "b", "8ba")
    first.fit()
    ckpt = sorted((tmp_path / "b" / "ck").glob("*.pt"))[-1]
    resumed = _gradual_trainer(tmp_path / "c", "16ba", load=str(ckpt), save=False)
    resumed.fit()
    a, b = straight.state.model.state_dict(), resumed.state.model.state_dict()
    assert set(a) == set(b) and "2.weight_mask" in a
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ---------------------------------------------------------------------------- the commands
def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "hasten.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600)


TINY = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "trainer.max_duration=12ba", "trainer.eval_interval=12ba",
        "data.eval_tokens=2048", "data.batch_size=8"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("compress")
    r = run_cli("train", "shakespeare-char-baseline", *TINY, f"trainer.run_dir={root / 'run'}", "--no-progress", cwd=root)
    assert r.returncode == 0, r.stderr
    return root


def test_compress_then_eval_end_to_end(trained_run):
    pytest.importorskip("torchao")
    root = trained_run
    r = run_cli("compress", "run", "--structured", "0.25", "--prune", "0.5", "--quantize", "int8", "--finetune", "4ba",
             "--no-latency", "--out", "out/tiny.hasten", cwd=root)
    assert r.returncode == 0, r.stderr
    assert "train 4/4 ba (100%)" in r.stderr                                 # the fine-tune's progress, in whole lines
    report = json.loads((root / "out" / "tiny.json").read_text())
    assert report["model_changes"] == {"mlp_hidden": 96, "n_head": 2, "head_dim": 16}   # 2 heads: 1.5 rounds to 2
    assert report["parameters"]["nonzero_after"] < report["parameters"]["nonzero_before"]
    assert (root / "out" / "tiny.md").is_file()
    from hasten.allocator import host_allocator_state
    assert report["host_allocator"] == host_allocator_state()            # recorded, as the recipe's setting left it
    assert report["host_allocator"].lower() in (root / "out" / "tiny.md").read_text().lower()
    r = run_cli("eval", "out/tiny.hasten", cwd=root)
    assert r.returncode == 0, r.stderr
    loss = float(r.stdout.split("val/loss=")[1].split()[0])
    assert loss == pytest.approx(report["after"]["val/loss"], abs=1e-4)


def test_compress_refuses_bad_input_in_one_line_and_writes_nothing(trained_run):
    root = trained_run
    for args, says in ((["--prune", "1"], "fraction in [0, 1)"),
                       (["model.n_embd=64"], "does not hold this recipe's model"),
                       (["--finetune", "soon"], "--finetune"),
                       (["--structured", "0.3", "--multiple-of", "0"], "--multiple-of"),
                       (["--structured", "0.5", "--quantize", "int4"], "invalid choice")):
        r = _cli("compress", "run", *args, "--no-latency", "--out", "bad/x.hasten", cwd=root)
        assert r.returncode in (1, 2), (args, r.stdout, r.stderr)
        assert says in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not (root / "bad").exists()
    r = _cli("compress", "nowhere", cwd=root)
    assert r.returncode == 2 and "no such run folder" in r.stderr


def test_finetune_trains_in_the_recipes_precision_and_evaluates_in_fp32(trained_run, monkeypatch):
    """The fine-tune follows trainer.precision (here set among the overrides); the evaluations
    around it stay in fp32: with nothing after the fine-tune, its own evaluation is the report's
    'after' (evaluated once), and it equals an fp32 evaluation of the saved artifact."""
    root = trained_run
    monkeypatch.chdir(root)
    reports = {}
    for precision in ("fp32", "bf16-mixed"):
        r = run_cli("compress", "run", "--prune", "0.5", "--finetune", "3ba", "--no-latency", "--no-progress",
                    f"trainer.precision={precision}", "--out", f"ft-{precision}/m.hasten", cwd=root)
        assert r.returncode == 0, r.stderr
        assert f"in {precision}" in r.stdout + r.stderr
        reports[precision] = json.loads((root / f"ft-{precision}" / "m.json").read_text())
    for precision, rep in reports.items():
        assert rep["finetune"]["precision"] == rep["finetune"]["asked_precision"] == precision
        assert rep["after_finetune"] == rep["after"]
        again = evaluate_artifact(root / f"ft-{precision}" / "m.hasten")    # fp32, the weights as saved
        assert again["val/loss"] == pytest.approx(rep["after"]["val/loss"], rel=1e-6)
        assert f"trained in {precision}" in (root / f"ft-{precision}" / "m.md").read_text()
    a, b = (reports[p]["after"]["val/loss"] for p in ("fp32", "bf16-mixed"))
    assert a != b and abs(a - b) < 0.05          # bf16 arithmetic took other steps, to nearly the same place


def test_finetune_computes_its_step_as_the_recipe_says(trained_run, monkeypatch):
    """The fine-tune takes the recipe's trainer.* step settings (here micro-batches of 2 of the
    batch of 8): the Trainer gets them, the report says so, and the step is the same step as the
    whole batch's (the loss after it equals the plain fine-tune's up to summation order)."""
    from hasten.compress import pipeline
    monkeypatch.chdir(trained_run)
    seen = []
    real = pipeline.assemble

    def spy(*args, **kwargs):
        seen.append(kwargs["step"])
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "assemble", spy)
    reports = {}
    for extra in ([], ["trainer.microbatch=2"]):
        r = pipeline.compress_run("run", prune=0.5, finetune_for="3ba", latency=False, progress=False,
                                  overrides=["trainer.precision=fp32", *extra], out=f"step{len(extra)}/m.hasten",
                                  log=lambda *a: None)
        reports[bool(extra)] = r.report
    assert [s.microbatch for s in seen] == [None, 2]
    assert reports[False]["finetune"]["step"] is None and reports[True]["finetune"]["step"] == "microbatch=2"
    assert "microbatch=2" in (trained_run / "step1" / "m.md").read_text()
    plain, micro = (reports[k]["after"]["val/loss"] for k in (False, True))
    assert micro == pytest.approx(plain, rel=1e-4)


@pytest.mark.slow
def test_int8_static_artifact_of_a_conv_run_reloads_to_the_same_evaluation(tmp_path):
    pytest.importorskip("torchao")
    from tiny import image_zip
    images = image_zip(tmp_path / "images.zip", train=48, test=24)   # the path is the point, not the data
    r = _cli("train", "cifar10-narrow", f"data.path={images}", "model.widths=[8,16,16]", "trainer.max_duration=3ba",
             "trainer.eval_interval=3ba", "data.batch_size=16", "data.eval_batch_size=12",
             "algorithms.patch_whitening.num_images=48", "trainer.run_dir=run", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = _cli("compress", "run", "--structured", "0.25", "--quantize", "int8-static", "--no-latency", "--export",
             "--out", "c.hasten", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["model_changes"] == {"widths": [6, 12, 12]} and (tmp_path / "c.pt2").is_file()
    assert report["artifact_form"] == "int8 graph"                           # checked to rebuild alike
    r = _cli("eval", "c.hasten", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    acc = float(r.stdout.split("val/acc=")[1].split()[0])
    assert acc == pytest.approx(report["after"]["val/acc"], abs=1e-4)        # re-quantized to the same model
    payload = torch.load(tmp_path / "c.hasten", weights_only=True)          # as from a torchao that quantizes
    payload["int8_static"]["numbers"] = payload["int8_static"]["numbers"][:-1]   # to another graph
    torch.save(payload, tmp_path / "other.hasten")
    r = _cli("eval", "other.hasten", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "does not fit the graph" in r.stderr, r.stderr
    assert f"torch {torch.__version__}" in r.stderr and "torchao 0." in r.stderr
    program = torch.export.load(tmp_path / "c.pt2").module()                 # and usable without hasten
    assert program(torch.randn(3, 3, 32, 32)).shape == (3, 10)


def test_an_unreadable_artifact_is_described_without_torchs_advice_to_run_its_code(tmp_path):
    from hasten.compress import read_artifact
    from hasten.errors import CheckpointError
    junk = tmp_path / "model.pt"
    junk.write_bytes(b"not an artifact")
    with pytest.raises(CheckpointError, match="not a file torch.save wrote") as e:
        read_artifact(junk)
    assert "weights_only" not in str(e.value)
