"""The time-to-quality harness: statistics, target detection, interleaving, resume, reports,
and that it detects a known slowdown (and no slowdown where there is none)."""
import json
import math
import warnings
from pathlib import Path

import pytest

from hasten.bench import report as R
from hasten.bench import runner
from hasten.bench.ladder import ladder_specs, ladder_steps
from hasten.bench.stats import betainc, ratio_ci, t_ppf, t_sf, welch_t_test
from hasten.bench.target import Target
from hasten.cli import main

TINY = Path(__file__).parent / "helpers" / "tiny_lm.yaml"
scipy_stats = pytest.importorskip("scipy.stats")


def test_t_distribution_and_welch_match_scipy():
    for df in (1.5, 2, 3.7, 10, 50):
        assert t_ppf(0.975, df) == pytest.approx(scipy_stats.t.ppf(0.975, df), rel=1e-9)
        assert t_sf(1.3, df) == pytest.approx(scipy_stats.t.sf(1.3, df), rel=1e-9)
    assert betainc(2.5, 0.5, 0.3) == pytest.approx(__import__("scipy.special").special.betainc(2.5, 0.5, 0.3), rel=1e-10)
    a, b = [1.2, 1.5, 1.1, 1.3], [2.0, 2.4, 2.1]
    ours, theirs = welch_t_test(a, b), scipy_stats.ttest_ind(a, b, equal_var=False)
    assert ours["t"] == pytest.approx(theirs.statistic) and ours["p"] == pytest.approx(theirs.pvalue, rel=1e-9)


def test_ratio_interval_is_the_exponentiated_welch_interval_of_log_times():
    base, other = [10.2, 9.7, 10.9], [5.1, 5.6, 4.9]
    ci = ratio_ci(base, other)
    res = scipy_stats.ttest_ind([math.log(x) for x in base], [math.log(x) for x in other], equal_var=False)
    lo, hi = res.confidence_interval(0.95)
    assert (ci["low"], ci["high"]) == (pytest.approx(math.exp(lo)), pytest.approx(math.exp(hi)))
    assert ci["ratio"] == pytest.approx(math.exp(sum(map(math.log, base)) / 3 - sum(map(math.log, other)) / 3))


def test_target_parsing():
    t = Target.parse("val/acc>=0.908")
    assert (t.metric, t.op, t.value) == ("val/acc", ">=", 0.908) and t.reached(0.91) and not t.reached(0.9)
    assert Target.parse("val/loss<=@first").from_first
    worst = Target.parse("val/loss<=@first-worst")
    assert worst.from_first and worst.rule == "worst" and str(worst) == "val/loss<=@first-worst"
    with pytest.raises(ValueError, match="METRIC>=VALUE"):
        Target.parse("val/acc>0.9")


def _run(label, seed, evals, warmup=0.5, final=True, status="finished"):
    ev = [{"kind": "eval", "train_s": t, "batch": i, "sample": 100 * (i + 1), "token": 0, "eval_s": 0.1,
           "metrics": {"val/acc": m}} for i, (t, m) in enumerate(evals)]
    fin = {"kind": "final", "metrics": {"val/acc": evals[-1][1]}, "train_s": evals[-1][0], "warmup_s": warmup,
           "eval_s": 0.1 * len(evals), "data_setup_s": 1.0, "method_setup_s": 0.0, "sample": 100 * len(evals),
           "token": 0, "batch": len(evals), "peak_memory_bytes": 2**20, "machine": {"cpu": "x"}} if final else None
    return {"label": label, "seed": seed, "status": status, "evals": ev, "final": fin}


def test_time_to_target_is_the_first_evaluation_past_it_minus_warmup():
    r = _run("a", 0, [(10, 0.80), (20, 0.91), (30, 0.95)], warmup=2.0)
    assert R.time_to_target(r, Target.parse("val/acc>=0.9"))["seconds"] == 18.0
    assert R.time_to_target(r, Target.parse("val/acc>=0.99")) is None
    assert R.timed_duration(r) == 28.0


def test_analysis_counts_misses_and_resolves_first_target(tmp_path):
    runs = [_run("a", s, [(10, 0.85), (20, 0.90 + 0.01 * s)]) for s in range(3)]
    runs += [_run("b", s, [(5, 0.90 + 0.02 * s), (10, 0.92)]) for s in range(3)]
    runs += [_run("c", s, [(50, 0.5)], status="capped", final=False) for s in range(2)]
    res = R.write_report(runs, ["a", "b", "c"], Target.parse("val/acc>=@first"), tmp_path, "t")
    assert res["target_value"] == pytest.approx(0.91)
    assert res["recipes"]["a"]["reached"] == 2 and res["recipes"]["c"]["reached"] == 0
    assert res["recipes"]["b"]["speedup_time_to_target"]["ratio"] > 1
    md = (tmp_path / "report.md").read_text()
    assert "| c | 0/2 |" in md and "| a | 2/3 |" in md
    assert (tmp_path / "report.png").stat().st_size > 1000
    assert json.loads((tmp_path / "report.json").read_text())["metric"] == "val/acc"


def test_a_long_recipe_spec_is_broken_into_legend_lines_and_the_plot_keeps_its_layout(tmp_path):
    long = "tuned+" + "+".join(f"optimizer.muon.setting_{i}={i / 10}" for i in range(8))
    lines = R.legend_label(long).split("\n")
    assert "".join(lines) == long and len(lines) > 3 and all(len(ln) <= 48 for ln in lines)
    assert all(ln.startswith("+") for ln in lines[1:]) and R.legend_label("tuned") == "tuned"
    runs = [_run(lab, s, [(10, 0.85), (20, 0.91)]) for lab in ("tuned", long) for s in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # matplotlib warns when the layout cannot fit the legend
        R.write_report(runs, ["tuned", long], Target.parse("val/acc>=0.9"), tmp_path, "t")
    assert (tmp_path / "report.png").stat().st_size > 1000


def test_one_machine_line_for_runs_that_differ_only_in_what_it_leaves_out(tmp_path):
    """Arms that set the host allocator differently ran on one machine: the report says so
    once, and a second CPU still gets its own line."""
    runs = [_run("a", s, [(10, 0.9)]) for s in range(2)] + [_run("b", s, [(5, 0.9)]) for s in range(2)]
    for r in runs[:2]:
        r["final"]["machine"] = {"cpu": "x", "cores": 2, "host_allocator": "glibc default"}
    for r in runs[2:]:
        r["final"]["machine"] = {"cpu": "x", "cores": 2, "host_allocator": "tuned"}
    R.write_report(runs, ["a", "b"], Target.parse("val/acc>=0.9"), tmp_path, "t")
    assert (tmp_path / "report.md").read_text().count("Machine: x") == 1
    runs[3]["final"]["machine"] = {"cpu": "y", "cores": 2}
    R.write_report(runs, ["a", "b"], Target.parse("val/acc>=0.9"), tmp_path, "t")
    md = (tmp_path / "report.md").read_text()
    assert md.count("Machine: x") == 1 and md.count("Machine: y") == 1


def test_a_run_under_kernel_caps_records_them_and_the_machine_line_says_so(tmp_path, monkeypatch):
    from hasten.bench.recording import machine
    from hasten.hardware import KERNEL_CAP_VARS
    for v in KERNEL_CAP_VARS:
        monkeypatch.delenv(v, raising=False)
    assert machine()["kernel_caps"] == {}
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert machine()["kernel_caps"] == {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    runs = [_run("a", s, [(10, 0.9)]) for s in range(2)]
    runs[0]["final"]["machine"] = {"cpu": "x", "cpu_features": ["avx2", "avx512_bf16"], "cores": 2,
                                   "kernel_caps": machine()["kernel_caps"]}
    runs[1]["final"]["machine"] = {"cpu": "x", "cpu_features": ["avx2", "avx512_bf16"], "cores": 2, "kernel_caps": {}}
    R.write_report(runs, ["a"], Target.parse("val/acc>=0.9"), tmp_path, "t")
    md = (tmp_path / "report.md").read_text()
    assert ("Machine: x (avx2, avx512_bf16), kernels capped by ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2, "
            "2 cores") in md
    assert "Machine: x (avx2, avx512_bf16), 2 cores" in md      # the uncapped run: a line of its own


def test_first_worst_target_is_reached_by_every_first_run_and_misses_are_censored(tmp_path):
    runs = [_run("a", s, [(10, 0.85), (20, 0.90 + 0.01 * s)]) for s in range(3)]
    runs += [_run("b", s, [(5, 0.90 + 0.02 * s), (10, 0.92)]) for s in range(2)]
    runs += [_run("b", 2, [(5, 0.80), (10, 0.85)])]                     # b's seed 2 misses
    res = R.write_report(runs, ["a", "b"], Target.parse("val/acc>=@first-worst"), tmp_path, "t")
    assert res["target_value"] == pytest.approx(0.90)
    assert res["recipes"]["a"]["reached"] == 3 and res["recipes"]["b"]["reached"] == 2
    # a reaches 0.90 at its second evaluation in every seed: 20 s - 0.5 s warm-up = 19.5 s;
    # b at 4.5 s in seeds 0 and 1, seed 2 is censored at its whole 9.5 s: KM median 4.5
    assert res["recipes"]["a"]["median_time_to_target_s"] == pytest.approx(19.5)
    assert res["recipes"]["b"]["median_time_to_target_s"] == pytest.approx(4.5)
    sp = res["recipes"]["b"]["speedup_time_to_target"]
    assert sp["reached"] == [3, 2] and sp["runs"] == [3, 3] and sp["ratio"] == pytest.approx(19.5 / 4.5)
    md = (tmp_path / "report.md").read_text()
    assert "| b | 2/3 |" in md and "Kaplan-Meier" in md


def test_runs_interleave_and_a_rerun_continues(tmp_path, monkeypatch):
    calls = []

    def fake(spec, seed, out_dir, cap_s=None, nproc=1):
        calls.append((spec.label, seed))
        return _run(spec.label, seed, [(1.0, 0.5)])

    monkeypatch.setattr(runner, "run_one", fake)
    specs = runner.unique_labels([runner.Spec.parse("x"), runner.Spec.parse("x"), runner.Spec.parse("y+optimizer.lr=1")])
    assert [s.label for s in specs] == ["x", "x #2", "y+optimizer.lr=1"] and specs[2].overrides == ["optimizer.lr=1"]
    runner.run_comparison(specs[:2], [0, 1], tmp_path)
    assert calls == [("x", 0), ("x #2", 0), ("x", 1), ("x #2", 1)]   # A B A B, seeds paired
    with open(tmp_path / "runs.jsonl") as f:
        lines = f.readlines()
    (tmp_path / "runs.jsonl").write_text("".join(lines[:3]) + lines[3][:20])   # a bench killed mid-write
    calls.clear()
    runs = runner.run_comparison(specs[:2], [0, 1, 2], tmp_path)
    assert calls == [("x #2", 1), ("x", 2), ("x #2", 2)]
    assert len(R.latest_per_run(runs)) == 6


def test_ladder_steps_from_a_recipe_diff(tmp_path):
    fast = tmp_path / "fast.yaml"
    fast.write_text("base: shakespeare-char-baseline\noptimizer: {lr: 0.002}\ntrainer: {precision: bf16-mixed}\n"
                    "algorithms: {ema: {decay: 0.99}}\n")
    steps = dict(ladder_steps("shakespeare-char-baseline", str(fast)))
    assert steps == {"trainer": ["trainer.precision=bf16-mixed"], "optimizer": ["optimizer.lr=0.002"],
                     "ema": ['algorithms.ema={"decay": 0.99}']}
    specs = ladder_specs("shakespeare-char-baseline", str(fast), order=["ema", "trainer", "optimizer"])
    assert [n for n, _ in specs] == ["baseline", "ema", "trainer", "optimizer"]
    assert specs[-1][1].overrides == ['algorithms.ema={"decay": 0.99}', "trainer.precision=bf16-mixed", "optimizer.lr=0.002"]
    with pytest.raises(ValueError, match="not steps"):
        ladder_steps("shakespeare-char-baseline", str(fast), order=["nope"])
    # either end may carry '+' overrides, as recipes do in `hasten bench`
    steps = dict(ladder_steps("shakespeare-char-baseline+optimizer.lr=0.002", str(fast) + "+trainer.grad_accum=2"))
    assert steps == {"trainer": ["trainer.precision=bf16-mixed", "trainer.grad_accum=2"],
                     "ema": ['algorithms.ema={"decay": 0.99}']}
    specs = ladder_specs("shakespeare-char-baseline+optimizer.lr=0.002", str(fast), shared=["data.path=x"])
    assert specs[0][1].recipe == "shakespeare-char-baseline"
    assert specs[0][1].overrides == ["data.path=x", "optimizer.lr=0.002"]


def test_the_bench_evaluation_cadence_wins_over_ladder_steps_and_recipes():
    """`--eval-every` is the harness's cadence: a step (cifar10-fast's trainer section sets
    eval_interval=10ep) or a recipe's own '+' override must not replace it."""
    from hasten.config import load_recipe
    cadence = ["trainer.eval_interval=25000sp"]
    specs = ladder_specs("cifar10-baseline", "cifar10-fast", shared=["data.path=x"], last=cadence)
    for _, spec in specs:
        assert load_recipe(spec.recipe, spec.overrides).trainer.eval_interval == "25000sp"
    spec = runner.Spec.parse("cifar10-fast+trainer.eval_interval=3ep", ["data.path=x"], cadence)
    assert load_recipe(spec.recipe, spec.overrides).trainer.eval_interval == "25000sp"


def test_ladder_report_reads_capped_runs_from_their_evaluations(tmp_path):
    """A row stopped by the cap has no final record: its time per sample and its final metric
    come from its last evaluation, and the table says where that value was read."""
    from hasten.bench.ladder import ladder_markdown, ladder_plot

    def ev(sample, train_s, acc):
        return {"sample": sample, "train_s": train_s, "token": 0, "batch": sample // 10, "metrics": {"val/acc": acc}}
    runs = [
        {"label": "baseline", "seed": 0, "status": "ok", "evals": [ev(500, 5.0, 0.6), ev(1000, 10.0, 0.8)],
         "final": {"train_s": 10.0, "warmup_s": 0.0, "sample": 1000, "metrics": {"val/acc": 0.8}}},
        {"label": "+a", "seed": 0, "status": "capped", "evals": [ev(400, 2.0, 0.5)]},
    ]
    steps = [("baseline", runner.Spec("baseline", "r")), ("a", runner.Spec("+a", "r"))]
    md, rows = ladder_markdown(runs, steps, Target.parse("val/acc>=0.7"), "t")
    assert rows[0]["time_to_target_s"] == 10.0 and rows[0]["final"] == 0.8
    assert rows[1]["s_per_sample"] == pytest.approx(0.005) and rows[1]["systems_x"] == pytest.approx(2.0)
    assert rows[1]["final"] == 0.5 and rows[1]["final_at_sample"] == 400 and rows[1]["reached"] == 0
    assert "| a | capped | 0/1 |" in md and "0.5000 (400 sp)" in md and "| 2.00 |" in md
    png = ladder_plot(rows, tmp_path / "ladder.png")
    assert png is None or png.stat().st_size > 0


def test_ladder_reads_the_speed_of_a_run_capped_before_its_first_evaluation():
    """A slow row can hit the cap before its first evaluation; its progress records (written
    at log points) still give its time per sample, and so the next row's systems ratio."""
    from hasten.bench.ladder import ladder_markdown
    runs = [
        {"label": "baseline", "seed": 0, "status": "capped", "evals": [],
         "progress": {"train_s": 40.0, "sample": 10000, "batch": 20, "token": 0}},
        {"label": "+a", "seed": 0, "status": "capped", "evals": [],
         "progress": {"train_s": 10.0, "sample": 10000, "batch": 20, "token": 0}},
    ]
    steps = [("baseline", runner.Spec("baseline", "r")), ("a", runner.Spec("+a", "r"))]
    _, rows = ladder_markdown(runs, steps, Target.parse("val/acc>=0.7"), "t")
    assert rows[0]["s_per_sample"] == pytest.approx(0.004) and rows[0]["final"] is None
    assert rows[1]["systems_x"] == pytest.approx(4.0)


def test_every_rung_of_the_cifar_ladder_is_a_valid_recipe():
    """The model step swaps ResNet-9 for the speedrun network, whose constructor has other keys."""
    from hasten.config import load_recipe, to_dict
    specs = ladder_specs("cifar10-baseline", "cifar10-fast+trainer.precision=bf16-mixed")
    for _, spec in specs:
        load_recipe(spec.recipe, spec.overrides)
    fast = to_dict(load_recipe("cifar10-fast", ["trainer.precision=bf16-mixed"]))
    last = to_dict(load_recipe(specs[-1][1].recipe, specs[-1][1].overrides))
    assert [k for k in fast if fast[k] != last[k]] == ["description", "name"]


def test_long_labels_that_share_a_prefix_get_their_own_logs(tmp_path, monkeypatch):
    """Two variants whose labels agree in their first 80 characters once wrote one log file."""
    import subprocess

    class Done:
        def __init__(self, cmd, stdout, **kw):
            stdout.write(" ".join(cmd[-2:]))
        def wait(self, timeout=None):
            return 0
    monkeypatch.setattr(subprocess, "Popen", Done)
    base = "cifar10-baseline+trainer.max_duration=14ep+schedule.warmup=2ep+trainer.eval_interval=100ep"
    logs = {runner.run_one(runner.Spec.parse(base + extra), 0, tmp_path)["log"] for extra in ("", "+trainer.precision=bf16-mixed")}
    assert len(logs) == 2 and all((tmp_path / "logs" / n).read_text() for n in logs)


@pytest.mark.slow
def test_harness_detects_a_known_slowdown_and_not_a_phantom_one(tmp_path, capsys):
    """Real runs in their own processes: the same recipe against itself must give a ratio
    near 1.0 (not its 95% interval containing 1.0, which fails 1 run in 20 by construction
    and more with order effects on a shared machine); a recipe that sleeps twice as long per
    step must be found slower, with an interval that excludes 1.0.

    Every recipe sleeps 30 ms a step, so a run's timed work (40 steps) is about 1.2 s of sleep
    and about 0.1 s of compute: a ratio of two such runs measures the harness's accounting,
    not the load of a shared machine (runs of 0.1 s of pure compute once gave 1.23 here)."""
    base = f"{TINY}+algorithms.delay.seconds=0.03"
    slower = f"{TINY}+algorithms.delay.seconds=0.06"
    code = main(["bench", base, base, slower, "--target",
                 "val/loss<=3.99", "--seeds", "3", "--out", str(tmp_path), "--name", "t"])
    assert code == 0
    res = json.loads((tmp_path / "t" / "report.json").read_text())
    same = res["recipes"]["tiny_lm+algorithms.delay.seconds=0.03 #2"]["speedup_timed_duration"]
    slow = res["recipes"]["tiny_lm+algorithms.delay.seconds=0.06"]["speedup_timed_duration"]
    assert 0.85 <= same["ratio"] <= 1.15 and same["low"] < same["ratio"] < same["high"], same
    assert slow["high"] < 1.0, slow
    # 40 steps of 30 ms more: the slowed runs take at least 1.2 s more per run
    td = {k: v["timed_duration_s"]["mean"] for k, v in res["recipes"].items()}
    assert td[slower.replace(str(TINY), "tiny_lm")] - td["tiny_lm+algorithms.delay.seconds=0.03"] >= 1.15
    assert "| tiny_lm+algorithms.delay.seconds=0.03 | " in capsys.readouterr().out
    # every run also recorded its progress at log points (every 10 batches of 40 here)
    runs = [json.loads(ln) for ln in (tmp_path / "t" / "runs.jsonl").read_text().splitlines()]
    assert all(r["progress"]["batch"] == 40 and 0 < r["progress"]["train_s"] <= r["final"]["train_s"] for r in runs)


def test_records_and_reports_name_the_code_that_ran(tmp_path):
    import subprocess
    from pathlib import Path as _P

    import hasten
    from hasten.provenance import code_version, describe, source_hash
    code = code_version()
    assert code["hasten"] == hasten.__version__ and len(code["source_sha256"]) == 64
    pkg = _P(hasten.__file__).resolve().parent
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=pkg, capture_output=True, text=True)
    if top.returncode == 0 and pkg.is_relative_to(_P(top.stdout.strip()).resolve()):   # an editable checkout
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=pkg, capture_output=True, text=True).stdout.strip()
        assert code["commit"] == head and isinstance(code["dirty"], bool)
    else:   # an installed wheel: no commit, the source hash stands for the code
        assert code["commit"] is None
    # the hash follows the content
    (tmp_path / "a.py").write_text("x = 1\n")
    first = source_hash(tmp_path)
    (tmp_path / "a.py").write_text("x = 2\n")
    assert source_hash(tmp_path) != first
    runs = [_run("a", s, [(1.0, 0.9)]) for s in range(2)]
    for r in runs:
        r["final"]["code"] = {"hasten": "0.1.0", "source_sha256": "ab" * 32, "commit": "c0ffee1234abcd", "dirty": True}
    R.write_report(runs, ["a"], Target.parse("val/acc>=0.5"), tmp_path, "t")
    md = (tmp_path / "report.md").read_text()
    assert "Code: commit c0ffee1234 (with uncommitted changes), hasten 0.1.0, source sha256 abababababab" in md
    assert describe(None).startswith("code not recorded")


def test_a_checkout_is_dirty_for_changed_code_not_for_its_results_record(tmp_path):
    """A measurement appends to the results record while it runs: that is not uncommitted code."""
    import subprocess

    from hasten.provenance import tree_dirty

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=tmp_path,
                       check=True, capture_output=True)

    files = {"src/hasten/a.py": "x = 1\n", "benchmarks/results/vision/r/runs.jsonl": "{}\n",
             "docs/results/vision.md": "# r\n", "docs/guide.md": "# g\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "c")
    assert tree_dirty(tmp_path / "src") is False
    (tmp_path / "benchmarks/results/vision/r/runs.jsonl").write_text("{}\n{}\n")
    (tmp_path / "docs/results/vision.md").write_text("# r, more\n")
    (tmp_path / "src/new.py").write_text("untracked = True\n")
    assert tree_dirty(tmp_path / "src") is False      # the record grew; no tracked code changed
    (tmp_path / "docs/guide.md").write_text("# g, edited\n")
    assert tree_dirty(tmp_path) is True
    git("checkout", "docs/guide.md")
    (tmp_path / "src/hasten/a.py").write_text("x = 2\n")
    assert tree_dirty(tmp_path / "benchmarks") is True
    assert tree_dirty(tmp_path / "no-such-folder") is None


def test_the_order_sentence_is_derived_from_the_records_provenance():
    """A report says 'alternating', 'first ... then', or 'copied from' from the records' start
    times and the comparison they were made for, never from the harness's intentions."""
    from hasten.provenance import PROVENANCE_FIELDS, order_sentence, run_provenance

    def rec(started, comparison="pair"):
        return {"provenance": {"started": started, "comparison": comparison}}
    assert set(run_provenance("pair", 3)) == set(PROVENANCE_FIELDS)
    alternating = {"peer": [rec("t1"), rec("t3")], "hasten": [rec("t2"), rec("t4"), rec("t5")]}
    assert order_sentence(alternating, "pair").startswith("runs alternating")
    one_then_other = {"peer": [rec("t1"), rec("t2")], "hasten": [rec("t3"), rec("t4")]}
    assert order_sentence(one_then_other, "pair").startswith("peer's runs first, then hasten's")
    copied = {"peer": [rec("t1", "earlier-pair"), rec("t3", "earlier-pair")], "hasten": [rec("t2"), rec("t4")]}
    said = order_sentence(copied, "pair")
    assert "copied from earlier-pair" in said and "alternating" not in said
    # hasten bench records the results folder's dated name; the harness knows the comparison's name
    dated = {"peer": [rec("t1"), rec("t3")], "hasten": [rec("t2", "2026-12-06-epyc-bf16-pair"), rec("t4", "2026-12-06-epyc-bf16-pair")]}
    assert order_sentence(dated, "pair").startswith("runs alternating")
    # ... but two dated folders are two comparisons (one of them another machine's): never alternating
    two = {"peer": [rec("t1"), rec("t3")], "hasten": [rec("t2", "2026-12-06-epyc-bf16-pair"), rec("t4", "2026-12-06-h200-pair")]}
    said = order_sentence(two, "pair")
    assert "alternating" not in said.replace("not alternating", "") and "copied from 2026-12-06-epyc-bf16-pair" in said

    def on(started, machine):
        return {"provenance": {"started": started, "comparison": "pair", "machine": {"cpu": machine}}}
    mixed = {"peer": [on("t1", "EPYC"), on("t3", "EPYC")], "hasten": [on("t2", "EPYC"), on("t4", "Xeon")]}
    said = order_sentence(mixed, "pair")
    assert said.startswith("runs recorded on 2 different machines") and "runs alternating" not in said
    same = {"peer": [on("t1", "EPYC"), on("t3", "EPYC")], "hasten": [on("t2", "EPYC"), on("t4", "EPYC")]}
    assert order_sentence(same, "pair").startswith("runs alternating")
    unknown = {"peer": [{"seed": 0}], "hasten": [rec("t2")]}
    assert "order is unknown" in order_sentence(unknown, "pair")


def test_a_bench_record_carries_its_provenance(tmp_path, monkeypatch):
    monkeypatch.setattr(runner.subprocess, "Popen", _FakeWorker)
    spec = runner.Spec("tiny", "tiny.yaml", [])
    record = runner.run_one(spec, 0, tmp_path / "my-comparison")
    p = record["provenance"]
    assert p["comparison"] == "my-comparison" and p["started"] and p["machine"]["cpu"]


class _FakeWorker:
    """A worker process that exits at once having written nothing (the record is 'failed')."""

    def __init__(self, *args, **kwargs):
        pass

    def wait(self, timeout=None):
        return 1
