"""Micro-batching by size and micro-batching that adapts to memory: the step stays the same
(bitwise on CPU against a run that used the final size from the start), out of memory is
simulated on the CPU by trainer.memory_limit, the size found is kept in checkpoints, and two
processes agree on it."""
import pytest
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Trainer
from hasten.errors import ConfigError
from hasten.microbatch import ActivationBudget, parse_bytes


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))


def _loader():
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(96, 8, generator=g), torch.randint(0, 4, (96,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))


def _fit(tmp_path=None, **kw):
    model = _net()
    t = Trainer(model, _loader(), optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                max_duration="12ba", seed=0, log_interval="4ba",
                save_folder=str(tmp_path) if tmp_path else None, save_interval="6ba", **kw)
    t.fit(summary=False)
    return t


def _saved_bytes(n):
    """What a micro-batch of n samples saves for backward in this model (training mode)."""
    model = _net().train()
    with ActivationBudget(10**12) as b:
        nn.functional.cross_entropy(model(torch.randn(n, 8)), torch.randint(0, 4, (n,)))
    return b.used


def test_micro_batches_by_size_are_the_same_step_as_grad_accum():
    a = _fit(grad_accum=4)
    b = _fit(microbatch=4)
    for p, q in zip(a.state.model.state_dict().values(), b.state.model.state_dict().values()):
        assert torch.equal(p, q)
    assert b.state.microbatch == 4


def test_auto_halves_on_out_of_memory_and_equals_the_run_that_used_the_final_size(tmp_path, capsys):
    limit = (_saved_bytes(4) + _saved_bytes(8)) // 2   # 4 samples fit, 8 do not
    auto = _fit(microbatch="auto", memory_limit=limit)
    assert auto.state.microbatch == 4
    assert "ran out of memory; micro-batches of 8" in capsys.readouterr().err
    fixed = _fit(microbatch=4)
    for (k, p), q in zip(auto.state.model.state_dict().items(), fixed.state.model.state_dict().values()):
        assert torch.equal(p, q), k    # buffers (batch-norm statistics), dropout draws and gradients all put back
    assert [float(x) for x in auto.state.step_losses] == [float(x) for x in fixed.state.step_losses]


class _EvalFits(nn.Module):
    """The test net, out of memory in evaluation on batches of more than `fits` samples (what
    CUDA raises on a GPU)."""

    def __init__(self, fits):
        super().__init__()
        self.net, self.fits, self.sizes = _net(), fits, []

    def forward(self, x):
        if not self.training and x.shape[0] > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        self.sizes.append(x.shape[0])
        return self.net(x)


def test_evaluation_adapts_the_same_way_and_scores_every_sample_once(capsys):
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(50, 8, generator=g), torch.randint(0, 4, (50,), generator=g)
    data = DataLoader(TensorDataset(x, y), batch_size=20)
    plain = Trainer(_EvalFits(10**9), data, eval_dataloader=data, max_duration="1ba", seed=0,
                    metrics={"acc": torchmetrics.classification.MulticlassAccuracy(4, average="micro")}).evaluate()
    model = _EvalFits(6)
    t = Trainer(model, data, eval_dataloader=data, max_duration="1ba", seed=0, microbatch="auto",
                metrics={"acc": torchmetrics.classification.MulticlassAccuracy(4, average="micro")})
    adapted = t.evaluate()
    assert model.sizes == [5, 5, 5, 5, 5, 5, 5, 5, 5, 5]   # 20 -> 10 -> 5; later batches start from 5
    assert adapted.keys() == plain.keys()
    for k in plain:
        assert adapted[k] == pytest.approx(plain[k], rel=1e-6), k   # (float32 sums in another order)
    assert "evaluation ran out of memory; batches of 5" in capsys.readouterr().err
    with pytest.raises(torch.OutOfMemoryError):   # without auto: out of memory, as it was
        Trainer(_EvalFits(6), data, eval_dataloader=data, max_duration="1ba").evaluate()


def test_the_size_found_is_kept_in_the_checkpoint_and_a_resume_starts_from_it(tmp_path):
    limit = (_saved_bytes(4) + _saved_bytes(8)) // 2
    _fit(tmp_path, microbatch="auto", memory_limit=limit)
    resumed = Trainer(_net(), _loader(), optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                      max_duration="14ba", save_folder=str(tmp_path), autoresume=True, microbatch="auto")
    assert resumed.state.timestamp.batch == 12 and resumed.state.microbatch == 4


def test_memory_limit_without_auto_is_out_of_memory_as_on_a_gpu():
    with pytest.raises(torch.OutOfMemoryError, match="trainer.memory_limit"):
        _fit(memory_limit=_saved_bytes(2))


@pytest.mark.parametrize("bad, message", [
    (dict(microbatch=0), "whole number"), (dict(microbatch="half"), "auto"),
    (dict(microbatch=4, grad_accum=2), "not both"), (dict(memory_limit="lots"), "512MB")])
def test_bad_micro_batch_settings_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        _fit(**bad)


def test_sizes_parse():
    assert parse_bytes("512MB") == 512 * 10**6 and parse_bytes("1GiB") == 2**30 and parse_bytes(1000) == 1000
    with pytest.raises(ConfigError):
        parse_bytes("-3MB")


def test_activation_checkpointing_keeps_the_step_and_saves_activations():
    from hasten.data import RandomWindows
    from hasten.models.gpt import GPT, GPTConfig
    tokens = torch.randint(0, 50, (4000,), generator=torch.Generator().manual_seed(0))

    def run(ac):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=32, vocab_size=50, block_size=32, dropout=0.0))
        t = Trainer(model, RandomWindows(tokens, 32, 8, seed=0), max_duration="3ba", activation_checkpointing=ac)
        t.fit(summary=False)
        x = torch.randint(0, 50, (8, 32))
        with ActivationBudget(10**12) as b:
            nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        return model, b.used
    plain, plain_bytes = run(False)
    ckpt, ckpt_bytes = run(True)
    for p, q in zip(plain.parameters(), ckpt.parameters()):
        assert torch.equal(p, q)          # recomputation is the same arithmetic
    assert ckpt_bytes < 0.6 * plain_bytes   # the blocks' insides are not kept


def test_activation_checkpointing_moved_out_of_fsdp_migrates_stored_runs_and_is_refused_in_new_recipes(tmp_path):
    """A run folder's recipe of schema_version 2 kept the switch under trainer.fsdp: it is read
    into trainer.activation_checkpointing (and the blocks are checkpointed); a recipe written now
    with the old key is refused in one line naming the key's place."""
    from pathlib import Path

    import yaml

    from hasten.build import build_run
    from hasten.config import load_recipe
    tiny = Path(__file__).parent / "helpers" / "tiny_lm.yaml"
    stored = {"schema_version": 2, **yaml.safe_load(tiny.read_text())}
    stored.setdefault("trainer", {})["fsdp"] = {"activation_checkpointing": True, "blocks": []}
    old = tmp_path / "recipe.yaml"
    old.write_text(yaml.safe_dump(stored))
    recipe = load_recipe(str(old), [f"trainer.run_dir={tmp_path / 'run'}"])
    assert recipe.trainer.activation_checkpointing
    run = build_run(recipe, progress_bar=False, console_logger=False)
    assert all(getattr(b, "_hasten_checkpointed", False) for b in run.trainer.state.model.fsdp_blocks())
    run.close(discard=True)
    with pytest.raises(ConfigError, match="write trainer.activation_checkpointing"):
        load_recipe(str(tiny), ["trainer.fsdp.activation_checkpointing=true"])
