"""benchmarks/tools/ladder_ends_from_pair.py: a pair's runs become a ladder's first and last rows
only when they trained exactly those rows' recipes, and the harness then counts them."""
import importlib.util
import json
from pathlib import Path

import pytest
from rich.console import Console

from hasten.bench.ladder import ladder_specs
from hasten.bench.runner import Spec, check_earlier_runs, run_identity

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tools" / "ladder_ends_from_pair.py"
SHARED = ["data.path=cifar.zip"]
LAST = ["trainer.eval_interval=25000sp"]


def _script():
    spec = importlib.util.spec_from_file_location("ladder_ends_from_pair", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pair(folder: Path, fast_text: str = "cifar10-vit-fast") -> None:
    folder.mkdir(parents=True)
    lines = []
    for text in ("cifar10-vit-baseline", fast_text):
        spec = Spec.parse(text, SHARED, LAST)
        for seed in (0, 1):
            lines.append(json.dumps({"label": spec.label, "recipe": spec.recipe, "overrides": spec.overrides,
                                     "seed": seed, "status": "finished", "wall_s": 1.0 + seed,
                                     "evals": [], "final": {"val/acc": 0.5 + seed / 10},
                                     "identity": run_identity(spec, None)}))
    (folder / "runs.jsonl").write_text("\n".join(lines) + "\n")


def _args(pair, ladder, seed=1):
    return [str(pair), str(ladder), "cifar10-vit-baseline", "cifar10-vit-fast", *SHARED,
            "--eval-every", "25000sp", "--seed", str(seed)]


def test_the_pairs_ends_become_the_ladders_first_and_last_rows_and_the_harness_counts_them(tmp_path):
    _pair(tmp_path / "pair")
    assert _script().main(_args(tmp_path / "pair", tmp_path / "ladder")) == 0
    rows = [json.loads(line) for line in (tmp_path / "ladder" / "runs.jsonl").read_text().splitlines()]
    steps = ladder_specs("cifar10-vit-baseline", "cifar10-vit-fast", None, SHARED, LAST)
    assert [r["label"] for r in rows] == [steps[0][1].label, steps[-1][1].label] == ["baseline", "+progressive_resizing"]
    assert [r["copied_from"]["label"] for r in rows] == ["cifar10-vit-baseline", "cifar10-vit-fast"]
    assert {r["seed"] for r in rows} == {1} and [r["final"]["val/acc"] for r in rows] == [0.6, 0.6]
    # the harness's own check: these runs continue the ladder, only the middle rows are left to run
    earlier, _ = check_earlier_runs([s for _, s in steps], [1], tmp_path / "ladder", None, Console(quiet=True))
    assert {r["label"] for r in earlier} == {"baseline", "+progressive_resizing"}
    # running it again adds nothing
    assert _script().main(_args(tmp_path / "pair", tmp_path / "ladder")) == 0
    assert len((tmp_path / "ladder" / "runs.jsonl").read_text().splitlines()) == 2


def test_a_pair_run_that_trained_other_settings_is_refused_naming_them(tmp_path):
    _pair(tmp_path / "pair", "cifar10-vit-fast+trainer.max_duration=4ep")
    with pytest.raises(SystemExit) as e:
        _script().main(_args(tmp_path / "pair", tmp_path / "ladder", seed=0))
    assert "no finished run of cifar10-vit-fast" in str(e.value)
    # the same label made with other settings (a recipe edited since the pair ran)
    rows = [json.loads(line) for line in (tmp_path / "pair" / "runs.jsonl").read_text().splitlines()]
    for r in rows:
        r["label"] = r["label"].split("+")[0]
    (tmp_path / "pair" / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit) as e:
        _script().main(_args(tmp_path / "pair", tmp_path / "ladder", seed=0))
    assert "trainer.max_duration: '4ep' -> '125000sp'" in str(e.value)
    assert not (tmp_path / "ladder" / "runs.jsonl").exists()
