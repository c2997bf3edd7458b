"""Recipes load into typed configs; bad keys and values are explained."""
import pytest

from hasten.config import ConfigError, available_recipes, load_recipe, parse_override


def test_packaged_recipes_list_and_validate():
    recipes = available_recipes()
    assert {"shakespeare-char-baseline", "cifar10-baseline"} <= set(recipes)
    for name, desc in recipes.items():
        assert desc, f"{name} has no description"
        load_recipe(name)


def test_baseline_recipe_states_the_nanogpt_configuration():
    r = load_recipe("shakespeare-char-baseline")
    m, d, o, s, t = r.model, r.data, r.optimizer, r.schedule, r.trainer
    assert (m.n_layer, m.n_head, m.n_embd, d.block_size, d.batch_size) == (4, 4, 128, 64, 12)
    assert (m.bias, m.tie_embeddings, m.dropout) == (False, True, 0.0)
    assert (o.name, o.lr, o.adam.betas, o.weight_decay) == ("adamw", 1e-3, [0.9, 0.99], 0.1)
    assert (s.name, s.warmup, s.min_factor) == ("cosine", "100ba", 0.1)
    assert (t.max_duration, t.eval_interval, t.grad_clip_norm) == ("2000ba", "250ba", 1.0)


def test_cifar_baseline_hyperparameters():
    r = load_recipe("cifar10-baseline")
    assert r.optimizer.name == "sgd" and r.optimizer.sgd.nesterov and r.optimizer.lr == 0.2
    assert r.data.batch_size == 512 and r.trainer.max_duration == "30ep" and r.schedule.warmup == "2ep"


def test_overrides_apply_with_yaml_values():
    r = load_recipe("shakespeare-char-baseline", ["trainer.max_duration=10ba", "optimizer.lr=3e-4",
                                                  "model.n_layer=2", "trainer.grad_clip_norm=null",
                                                  "algorithms.ema.decay=0.99"])
    assert r.trainer.max_duration == "10ba" and r.optimizer.lr == 3e-4 and r.model.n_layer == 2
    assert r.trainer.grad_clip_norm is None and r.algorithms == {"ema": {"decay": 0.99}}
    r = load_recipe("shakespeare-char-baseline", ["algorithms.ema.decay=0.99", "algorithms.ema=null"])
    assert r.algorithms == {}


@pytest.mark.parametrize("override,needle", [
    ("trainer.max_duraton=10ba", "Did you mean 'max_duration'"),
    ("optimzer.lr=1", "Did you mean 'optimizer'"),
    ("trainer.precision=bf16", "choose one of ['fp32', 'bf16-mixed', 'fp16-mixed', 'auto']"),
    ("trainer.max_duration=10 epochs", "trainer.max_duration"),
    ("trainer.seed=abc", "trainer.seed: expected a whole number"),
    ("model.n_layers=3", "Did you mean 'n_layer'"),
    ("data.tokenizer=words", "choose one of ['char', 'byte', 'bpe', 'none']"),
    ("algorithms.emaa.decay=0.9", "Did you mean 'ema'"),
    ("algorithms.ema.decy=0.9", "Did you mean 'decay'"),
    ("task=vision", "not a known task"),
    ("schedule.warmup=100", "schedule.warmup"),
    ("trainer.max_duration", "key.sub=value"),
    ("trainer.lr=1", "'lr' is a key of optimizer and optimizer.muon: write optimizer.lr or optimizer.muon.lr"),
    ("trainer.batch_size=8", "'batch_size' is a key of data: write data.batch_size"),
    ("optimizer.max_duration=8ba", "write trainer.max_duration"),
    ("data.n_layer=2", "'n_layer' is a key of model: write model.n_layer"),
])
def test_bad_keys_and_values_are_named(override, needle):
    with pytest.raises(ConfigError) as e:
        load_recipe("shakespeare-char-baseline", [override])
    assert needle in str(e.value)


def test_unknown_recipe_suggests():
    with pytest.raises(ConfigError, match="Did you mean 'cifar10-baseline'"):
        load_recipe("cifar10-baselin")


def test_recipe_file_with_base(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("base: shakespeare-char-baseline\ndescription: mine\noptimizer:\n  lr: 0.002\n")
    r = load_recipe(str(f))
    assert r.name == "mine" and r.optimizer.lr == 0.002 and r.optimizer.adam.betas == [0.9, 0.99]


def test_a_null_in_a_recipe_with_a_base_removes_what_the_base_has(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("base: cifar10-fast\nalgorithms:\n  progressive_resizing: null\n  ema:\n"
                 "optimizer:\n  sgd: null\n")
    r = load_recipe(str(f))
    written = load_recipe("cifar10-fast", ["algorithms.progressive_resizing=null", "optimizer.sgd=null"])
    assert "progressive_resizing" not in r.algorithms and "progressive_resizing" in load_recipe("cifar10-fast").algorithms
    assert r.algorithms.pop("ema") == {}          # a null for a name the base lacks: the algorithm with its defaults
    assert r.algorithms == written.algorithms and r.optimizer == written.optimizer


def test_the_gpu_speedrun_recipe_is_cifar10_fast_with_the_peers_procedure():
    gpu = load_recipe("cifar10-fast-gpu")
    same = load_recipe("cifar10-fast", ["trainer.max_duration=8ep", "trainer.eval_interval=8ep",
                                        "algorithms.progressive_resizing=null", "algorithms.tta.fraction=1.0",
                                        "algorithms.selective_backprop=null", "trainer.compile=true", "trainer.compile_mode=reduce-overhead"])
    assert (gpu.trainer, gpu.algorithms, gpu.model, gpu.data, gpu.optimizer, gpu.schedule) == \
        (same.trainer, same.algorithms, same.model, same.data, same.optimizer, same.schedule)


def test_parse_override_values():
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a=1e-3") == (["a"], 1e-3)


def test_every_field_has_a_docstring_and_the_generated_reference_is_current():
    import dataclasses
    from pathlib import Path

    from hasten.config import OptimizerConfig, ScheduleConfig, TrainerConfig, reference
    from hasten.schema import field_docs
    from hasten.tasks import TASKS
    from hasten.tasks import NamedModel
    classes = [TrainerConfig, OptimizerConfig, ScheduleConfig] + [t.data_config for t in TASKS.values()]
    classes += [t.model_config for t in TASKS.values() if t.model_config is not NamedModel]
    for cls in classes:
        docs = field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"{cls.__qualname__}: fields without a docstring under them: {missing}"
    doc = Path(__file__).parent.parent / "docs" / "configuration-reference.md"
    assert doc.read_text() == reference(), \
        "docs/configuration-reference.md is stale: run python -m hasten.config > docs/configuration-reference.md"


def test_optimizer_keys_nest_per_family_and_a_foreign_sub_section_is_an_error():
    from hasten.config import load_recipe, to_dict
    r = load_recipe("cifar10-fast", ["optimizer.muon.lr=0.3", "optimizer.sgd.momentum=0.8"])
    assert (r.optimizer.muon.lr, r.optimizer.sgd.momentum, r.optimizer.muon.others) == (0.3, 0.8, "sgd")
    assert "adam" not in to_dict(r)["optimizer"]            # the sub-section it does not read is left out
    # a key for an optimizer the recipe does not use is refused, naming the key and the fix
    for bad in ("optimizer.adam.betas=[0.9,0.95]", "optimizer.muon.lr=0.1"):
        base = "cifar10-fast" if "adam" in bad else "cifar10-baseline"
        with pytest.raises(ConfigError, match=r"optimizer\.(adam|muon)\.(betas|lr): .*applies to .*=null"):
            load_recipe(base, [bad])
    # switching optimizers from the command line: drop the sub-section it no longer reads
    r = load_recipe("cifar10-baseline", ["optimizer.name=adamw", "optimizer.sgd=null", "optimizer.adam.eps=1e-6"])
    assert r.optimizer.name == "adamw" and r.optimizer.adam.eps == 1e-6


def test_a_flat_optimizer_key_of_schema_version_1_is_refused_naming_where_it_moved():
    """Only a run folder's recipe that states schema_version 1 is migrated (below); a recipe or
    an override written now with a flat key is told, in one line, where the key lives."""
    from hasten.config import load_recipe
    with pytest.raises(ConfigError, match=r"optimizer\.muon_lr is optimizer\.muon\.lr.*write optimizer\.muon\.lr"):
        load_recipe("shakespeare-char-fast", ["optimizer.muon_lr=0.07"])
    with pytest.raises(ConfigError, match=r"optimizer\.momentum is optimizer\.sgd\.momentum"):
        from hasten.config import validate
        validate({"task": "char_lm", "optimizer": {"name": "sgd", "momentum": 0.8}})


def test_a_run_folder_recipe_written_by_0_1_resumes_without_a_warning(tmp_path):
    """schema_version 1 listed every flat key, defaults of unused optimizers included."""
    import warnings

    from hasten.config import load_recipe
    old = tmp_path / "recipe.yaml"
    old.write_text("schema_version: 1\ntask: char_lm\nname: old\nmodel: {n_layer: 1, n_head: 2, n_embd: 16}\n"
                   "optimizer: {name: adamw, lr: 0.001, momentum: 0.9, nesterov: false, betas: [0.9, 0.99], "
                   "eps: 1.0e-8, per_example: false, muon_lr: 0.02, muon_others: adamw, muon_ns_dtype: auto}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = load_recipe(str(old))
    assert r.optimizer.adam.betas == [0.9, 0.99] and r.optimizer.name == "adamw"
