"""The command line: hasten train [--resume RUN_DIR] | bench | compress | eval | recipes | --version.

Every error a user can cause is printed as one line (`hasten: error: ...`) with exit code 2
for a wrong recipe or argument and 1 for other faults; `--debug` or HASTEN_DEBUG=1 shows
the traceback instead.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import warnings
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import yaml
from rich.console import Console

from .version import __version__
from .bench.ladder import ladder_markdown, ladder_plot, ladder_specs
from .bench.report import latest_per_run, resolve_target, write_report
from .bench.runner import BenchInterrupted, Spec, bench_outputs, check_earlier_runs, outcome, run_comparison, unique_labels
from .bench.target import Target
from .build import build_algorithms, build_run
from .compress.artifact import require_artifact
from .compress.pipeline import compress_run, evaluate_artifact
from .config import available_recipes, load_recipe, to_dict
from .schema import check_time, suggest
from .core import Time, TimeUnit
from .core.algorithm import parallel_refusal_message
from .distributed.world import leave_worker
from .data.prepare import describe as describe_source
from .data.prepare import prepare as prepare_source
from .errors import ConfigError, HastenError, worker_report
from .files import atomic_write, ensure_writable_dir
from .processes import Terminated, raise_terminated
from .runs import resume_recipe
from .usercode import TRUST_ENV, trust_code_here_and_in_workers
from .tasks import TASKS
from .tune import render as render_tune
from .tune import tune
from .tune.lr_range import lr_range_test

DEFAULT_RECIPE = "shakespeare-char-baseline"


def _cmd_recipes(args) -> int:
    recipes = available_recipes()
    width = max(map(len, recipes), default=0)
    for name, desc in recipes.items():
        print(f"{name:<{width}}  {desc}")
    return 0


def _cmd_train(args) -> int:
    console = Console(highlight=False, soft_wrap=True)
    if args.resume:
        if args.recipe_given:
            raise ConfigError(f"--resume continues the run stored in {args.resume}: give no recipe "
                              f"({args.recipe!r}), only overrides such as trainer.max_duration=...")
        recipe = resume_recipe(args.resume, args.overrides, force=args.force, trust_code=args.trust_code)
    else:
        recipe = load_recipe(args.recipe, args.overrides)
    if args.print_config:

        print(yaml.safe_dump(to_dict(recipe), sort_keys=False), end="")
        return 0
    if args.nproc is not None and "WORLD_SIZE" not in os.environ:
        return _launch_torchrun(args, recipe)
    if args.print_events:   # the run built for real (data included) in a folder that is then removed
        with tempfile.TemporaryDirectory(prefix="hasten-events-") as tmp:
            recipe.trainer.run_dir, recipe.trainer.autoresume = str(Path(tmp) / "run"), False
            run = build_run(recipe, progress_bar=False if args.no_progress else None)
            print(run.trainer.describe())
            run.close()
        return 0
    if threading.current_thread() is not threading.main_thread():   # handlers are the main thread's to set
        return _train(args, recipe, console)
    old_sigterm = signal.signal(signal.SIGTERM, raise_terminated)   # set-up stopped by SIGTERM undoes it, as Ctrl-C does
    try:
        return _train(args, recipe, console)
    finally:
        signal.signal(signal.SIGTERM, old_sigterm)


def _train(args, recipe, console) -> int:
    run = build_run(recipe, progress_bar=False if args.no_progress else None, force=args.force)
    state = run.trainer.state
    if not run.trainer.world.is_main:   # under torchrun rank 0 alone reports
        console = Console(file=open(os.devnull, "w"))
    params = run.built.info.get("params")
    console.print(f"hasten {__version__}: recipe [bold]{recipe.name}[/] on {state.device} "
                  f"({state.precision}" + (", chosen by precision=auto" if state.runtime.asked_precision == "auto" else "")
                  + f"), {params:,} parameters, max_duration {state.max_duration}"
                  + _started_from(state))
    if recipe.trainer.autoresume and not state.resumed_from:
        console.print(f"autoresume: no checkpoint in {run.run_dir} yet; starting the run from the beginning")
    console.print(f"run folder: {run.run_dir}" + (f"; {run.trainer.world.size} processes, data-parallel"
                                                   if run.trainer.world.size > 1 else ""))
    t0 = time.perf_counter()
    finished = False
    run.trainer.resume_hint = ""   # a stop by a signal ends with the command that resumes it, below
    try:
        run.trainer.fit(summary=False)
        finished = state.stop_reason not in ("sigterm", "sigint", "logger")
    finally:
        discard = not finished and not run.trained   # stopped before its first step: it leaves nothing behind
        run.close(discard=discard)
        if discard:
            print(f"hasten: the run stopped before its first step; removed what it had made in {run.run_dir}",
                  file=sys.stderr)
    wall = time.perf_counter() - t0
    if state.stop_reason == "logger":
        saved = f"checkpoint: {state.last_checkpoint}" if state.last_checkpoint else "no checkpoint was written"
        console.print(f"stopped after batch {state.timestamp.batch}: {run.trainer.logger.failure}; {saved}. Resume "
                      f"with: hasten train --resume {run.run_dir} (add trainer.on_logger_error=continue to train on "
                      "without that logger)")
        return 1
    if state.stop_reason in ("sigterm", "sigint"):
        what = "Ctrl-C" if state.stop_reason == "sigint" else "SIGTERM"
        saved = f"checkpoint: {state.last_checkpoint}" if state.last_checkpoint else "no checkpoint was written"
        console.print(f"stopped by {what} after batch {state.timestamp.batch}; {saved}. "
                      f"Resume with: hasten train --resume {run.run_dir}")
        return 130 if state.stop_reason == "sigint" else 143   # 128 + the signal, as a shell reports it
    metrics = "  ".join(f"{k}={v:.4f}" for k, v in state.eval_metrics.items())
    console.print(f"done in {wall:.1f} s ({state.timestamp.batch} batches, {state.timestamp.train_seconds:.1f} s training)"
                  + (f"; stopped early: {state.stop_reason}" if state.stop_reason else ""))
    console.print(f"final {metrics}")
    console.print(f"checkpoint: {state.last_checkpoint}")
    console.print(f"logs: {run.run_dir / 'metrics.jsonl'}"
                  + (f", TensorBoard: {run.run_dir / 'tensorboard'}" if (run.run_dir / 'tensorboard').exists() else ""))
    return 0


def _started_from(state) -> str:
    r = state.resumed_from
    if not r:
        return ""
    if r.get("weights_only"):
        fresh = r.get("fresh") or []
        return (f", starting from the weights of {r['path']}" + (f" ({r['loaded']} tensors)" if "loaded" in r else "")
                + (f"; fresh: {', '.join(fresh[:4])}{' ...' if len(fresh) > 4 else ''}" if fresh else ""))
    return f", resuming at batch {state.timestamp.batch} from {r['path']}"


def _launch_torchrun(args, recipe) -> int:
    """`hasten train --nproc N ...`: the same command under torchrun on this machine (a thin
    convenience; on several machines call torchrun yourself, see docs/distributed.md). What can
    be refused is refused here, once, before any process starts."""

    if args.nproc < 1:
        raise ConfigError(f"--nproc {args.nproc}: give at least 1 process")
    mode = "fsdp" if recipe.trainer.parallelism == "fsdp" else "ddp"
    refused = parallel_refusal_message(build_algorithms(recipe), mode) if args.nproc > 1 or mode == "fsdp" else None
    if refused:
        raise ConfigError(refused)
    argv = [a for i, a in enumerate(args.argv) if a != "--nproc" and not a.startswith("--nproc=")
            and not (i > 0 and args.argv[i - 1] == "--nproc")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           "-m", "hasten.cli", "train", *argv]
    return supervise(cmd)


def supervise(cmd: list[str], grace_s: float = 60.0) -> int:
    """Run `cmd` (torchrun and its workers) in a process group of its own, and end the whole
    group on every path: Ctrl-C or SIGTERM to this launcher is passed on to every worker (they
    save at the end of the step and stop); a group still running `grace_s` later, or at a second
    Ctrl-C, gets SIGTERM, then SIGKILL. No worker outlives the launcher (nor keeps the run's lock)."""
    proc = subprocess.Popen(cmd, start_new_session=True)
    got: list[int] = []

    def forward(signum, frame):
        got.append(signum)
        _signal_group(proc, signal.SIGINT if signum == signal.SIGINT and len(got) == 1 else signal.SIGTERM)

    old = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    deadline, escalation = None, [signal.SIGTERM, signal.SIGKILL]
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if got and deadline is None:
                    deadline = time.monotonic() + grace_s
                if deadline is not None and time.monotonic() > deadline and escalation:
                    _signal_group(proc, escalation.pop(0))
                    deadline = time.monotonic() + 10.0
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if proc.poll() is None:   # this launcher is failing: take the group down with it
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    if got:
        return 130 if got[0] == signal.SIGINT else 143
    return code


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _check_bench_input(args, specs: list) -> list:
    """Everything `hasten bench` can check before its first run: the target, the counts,
    the evaluation cadence, and every recipe with its overrides (loaded and validated here,
    algorithms' arguments included)."""
    Target.parse(args.target)
    if args.seeds < 1:
        raise ConfigError(f"--seeds {args.seeds}: give at least 1 run per recipe")
    if args.ladder and len(args.nproc) > 1:
        raise ConfigError(f"--nproc {','.join(map(str, args.nproc))}: a ladder runs at one world size; give one number")
    if args.cap is not None and not args.cap > 0:
        raise ConfigError(f"--cap {args.cap}: give a positive number of seconds")
    if args.eval_every:
        check_time(args.eval_every, "--eval-every", positive=True)
    recipes = []
    for spec in specs:
        try:
            recipes.append(load_recipe(spec.recipe, spec.overrides))   # every value, algorithm arguments included
        except ConfigError as e:
            raise ConfigError(f"recipe {spec.label}: {e}") from None
    return recipes


def _keep_dir(args) -> "Path | None":
    """--keep-checkpoints DIR, made and checked writable before the first run."""
    if not args.keep_checkpoints:
        return None
    keep = Path(args.keep_checkpoints)
    ensure_writable_dir(keep, "--keep-checkpoints")
    return keep


def _cmd_bench(args) -> int:
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    specs_text = [a for a in args.items if "=" not in a.split("+", 1)[0]]
    shared = [a for a in args.items if a not in specs_text]
    if not specs_text:
        raise ConfigError("hasten bench: give at least one recipe")
    # the harness's evaluation cadence wins over recipes and ladder steps alike
    last = [f"trainer.eval_interval={args.eval_every}"] if args.eval_every else []
    seeds = [args.seed0 + i for i in range(args.seeds)]
    command = "hasten bench " + " ".join(shlex.quote(a) for a in args.argv)
    if args.ladder:
        steps = ladder_specs(specs_text[0], args.ladder, args.order.split(",") if args.order else None, shared, last)
        steps = [(name, _at_world_sizes([spec], args.nproc[:1])[0]) for name, spec in steps]
        specs = [s for _, s in steps]
    else:
        specs = _at_world_sizes(unique_labels([Spec.parse(t, shared, last) for t in specs_text]), args.nproc)
    recipes = _check_bench_input(args, specs)
    target = Target.parse(args.target).for_task(TASKS[recipes[0].task].quality)
    logged = {m for r in recipes for m in TASKS[r.task].logs}
    if target.metric not in logged:
        raise ConfigError(f"--target {args.target}: no run of these recipes logs {target.metric!r}; their evaluations "
                          f"log {sorted(logged)}." + suggest(target.metric, logged))
    got = {}

    def on_signal(signum, frame):   # SIGTERM stops the bench as Ctrl-C does
        got["signal"] = signum
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if args.ladder:
            runs, out_dir = _bench_ladder(args, steps, specs_text, target, seeds, command, console)
        else:
            out_dir = Path(args.out) / (args.name or "-vs-".join(Path(s.recipe).stem for s in specs))
            check_earlier_runs(specs, seeds, out_dir, args.cap, console)   # refused before anything is said or run
            keep = _keep_dir(args)
            console.print(f"bench: {len(specs)} recipe(s) x {len(seeds)} seed(s), interleaved; target {target}; "
                          f"results in {out_dir}")
            runs = run_comparison(specs, seeds, out_dir, args.cap, console, metric=target.metric, keep=keep)
            write_report(runs, [s.label for s in specs], target, out_dir, args.title or "hasten bench", command)
            print((out_dir / "report.md").read_text())
            console.print(f"report: {out_dir / 'report.md'} (JSON: report.json, plot: report.png, runs: runs.jsonl)")
    except (BenchInterrupted, KeyboardInterrupt) as e:
        signum = got.get("signal", signal.SIGINT)
        done = f" after {e.done} of {e.total} runs" if isinstance(e, BenchInterrupted) else ""
        console.print(f"hasten bench: interrupted{done}; the stopped run is not counted. "
                      f"Continue with the same command: {command}")
        return 128 + signum
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    failed = [r for r in latest_per_run(runs) if outcome(r) == "failed"]
    if failed:
        console.print(f"[red]{len(failed)} run(s) failed[/] (listed in the report); rerun the same command to retry them")
        return 1
    return 0


def _cmd_compress(args) -> int:
    try:
        result = compress_run(args.source, prune=args.prune, scope=args.scope, structured_ratio=args.structured,
                              quant=args.quantize, finetune_for=args.finetune, lr_factor=args.finetune_lr,
                              out=args.out, overrides=args.overrides, export=args.export,
                              latency=not args.no_latency, repeats=args.repeats,
                              trust_code=args.trust_code, progress=not args.no_progress,
                              multiple_of=args.multiple_of)
    except ValueError as e:   # a bad sparsity or mode from the functional layer: a user mistake
        if isinstance(e, HastenError):
            raise
        raise ConfigError(str(e)) from None
    print(open(result.report_path).read())
    print(f"artifact: {result.artifact}\nreport: {result.report_path} (and {result.report_path.with_suffix('.json').name})")
    return 0


def _cmd_eval(args) -> int:
    t0 = time.perf_counter()
    require_artifact(args.artifact)   # a missing file is said before an evaluation is announced
    metrics = evaluate_artifact(args.artifact, args.overrides, trust_code=args.trust_code, announce=lambda: print(
        f"evaluating {args.artifact} on its recipe's evaluation data", file=sys.stderr, flush=True))
    print("  ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    print(f"done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def _cmd_data_prepare(args) -> int:
    console = Console(stderr=True, highlight=False, soft_wrap=True, quiet=args.no_progress)
    manifest, wrote = prepare_source(args.source, args.out, block_size=args.block_size, vocab_size=args.vocab_size,
                                     val_every=args.val_every, text_field=args.text_field, shard_mb=args.shard_mb,
                                     seed=args.seed, console=console)
    print(describe_source(manifest, args.out) + ("" if wrote else " (already prepared with these settings)"))
    key = "data.source" if manifest["kind"] == "tokens" else "data.stream"
    print(f"train from it with {key}={args.out}")
    return 0


def _cmd_tune(args) -> int:
    if threading.current_thread() is not threading.main_thread():
        return _tune(args)
    old_sigterm = signal.signal(signal.SIGTERM, raise_terminated)   # a trial's worker and temporaries go with tune
    try:
        return _tune(args)
    finally:
        signal.signal(signal.SIGTERM, old_sigterm)


def _tune(args) -> int:
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    load_recipe(args.recipe, args.overrides)   # every key and value checked before anything runs
    if args.lr:
        if args.lr_steps < 20:
            raise ConfigError(f"--lr-steps {args.lr_steps}: give at least 20 steps")
        result = lr_range_test(args.recipe, args.overrides, steps=args.lr_steps, out=args.out)
        print(Path(result["report"]).read_text())
        return 0
    try:
        budget = Time.parse(args.budget)
    except ValueError:
        budget = None
    if budget is None or budget.unit != TimeUnit.SECOND or budget.value <= 0:
        raise ConfigError(f"--budget {args.budget}: give a wall-clock time, e.g. 10m, 600s or 1h")
    gain = args.min_gain.strip()
    try:
        min_gain = float(gain[:-1]) / 100 if gain.endswith("%") else float(gain)
    except ValueError:
        min_gain = -1.0
    if not 0 <= min_gain < 1:
        raise ConfigError(f"--min-gain {args.min_gain}: give a fraction or a percentage, e.g. 0.05 or 5%")
    result = tune(args.recipe, args.overrides, budget_s=float(budget.value), out=args.out, fresh=args.fresh,
                  console=console, min_gain=min_gain, methods=args.methods)
    out = Path(args.out) if args.out else Path("tune-results") / result["recipe"]
    print(render_tune(result))
    console.print(f"tuned recipe: {out / 'tuned.yaml'} (hasten train {out / 'tuned.yaml'}); report: {out / 'tune.md'}")
    return 0


def _fraction(text: str) -> float:
    """A sparsity or ratio: a number in [0, 1)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a fraction in [0, 1), e.g. 0.5") from None
    if not 0.0 <= v < 1.0:
        raise argparse.ArgumentTypeError(f"{text}: give a fraction in [0, 1) (the share of weights removed), e.g. 0.5")
    return v


def _nproc_list(text: str) -> list[int]:
    """--nproc N or N,M,...: each a whole number of processes >= 1."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of processes, or several joined by commas (1,2)") from None
    if any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: give at least 1 process")
    return counts


def _at_world_sizes(specs: list, counts: list[int]) -> list:
    """Every spec at every world size of --nproc (in the order given); labels name the size
    when there are several ('RECIPE x2proc'), so a run at 2 processes is compared with 1."""
    if len(counts) == 1:
        return [replace(s, nproc=counts[0]) for s in specs]
    return [replace(s, label=f"{s.label} x{n}proc", nproc=n) for s in specs for n in counts]


def _bench_ladder(args, steps, specs_text, target, seeds, command, console):
    ends = [Path(Spec.parse(t).recipe).stem for t in (specs_text[0], args.ladder)]
    out_dir = Path(args.out) / (args.name or f"ladder-{ends[0]}-to-{ends[1]}")
    check_earlier_runs([s for _, s in steps], seeds, out_dir, args.cap, console)
    keep = _keep_dir(args)
    console.print(f"ladder: {len(steps)} rows ({', '.join(n for n, _ in steps)}), {len(seeds)} seed(s) each, "
                  f"cap {args.cap or 'none'} s per run; results in {out_dir}")
    runs = run_comparison([s for _, s in steps], seeds, out_dir, args.cap, console, metric=target.metric, keep=keep)
    tgt = resolve_target(target, runs, "baseline")
    md, rows = ladder_markdown(runs, steps, tgt, f"Ladder: {specs_text[0]} to {args.ladder}", command)
    outputs = bench_outputs(out_dir)   # checked before the ladder ran
    outputs.claim(["ladder.md", "ladder.json", "ladder.png"])
    png = ladder_plot(rows, out_dir / "ladder.png")
    if png:
        md += f"\n![time to target per step]({png.name})\n"
    atomic_write(out_dir / "ladder.md", lambda f: f.write(md), binary=False)
    atomic_write(out_dir / "ladder.json", lambda f: json.dump({"command": command, "target": str(tgt), "rows": rows}, f,
                                                             indent=2), binary=False)
    outputs.record(["ladder.md", "ladder.json", "ladder.png"])
    print(md)
    return runs, out_dir


def _trust_flag(parser) -> None:
    parser.add_argument("--trust-code", action="store_true", help="import the code (model or data) named by a "
                        "recipe file, base recipe, run folder or artifact that belongs to another user (a recipe that "
                        "names code runs it: docs/your-model.md); passed on to the processes bench and tune start")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hasten", description="Fast PyTorch training with measured speedups.")
    p.add_argument("--version", action="version", version=f"hasten {__version__}")
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error "
                   "(also: HASTEN_DEBUG=1)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    t = sub.add_parser("train", help="train a recipe", description="Train a packaged recipe or a YAML file. "
                       "Overrides are key.sub=value, e.g. trainer.max_duration=200ba optimizer.lr=3e-4.")
    t.add_argument("recipe", nargs="?", default=None,
                   help=f"recipe name (see 'hasten recipes') or YAML path; default {DEFAULT_RECIPE}")
    t.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--print-config", action="store_true", help="print the resolved recipe and exit")
    t.add_argument("--print-events", action="store_true", help="print who runs at each event, in order, and exit")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR with its stored recipe "
                   "(overrides that change the run's mathematics are refused without --force)")
    t.add_argument("--force", action="store_true", help="with --resume: allow overrides that change the run")
    _trust_flag(t)
    t.add_argument("--nproc", type=int, metavar="N", help="train data-parallel in N processes on this machine "
                   "(runs the command under torchrun --standalone)")
    t.set_defaults(func=_cmd_train)
    b = sub.add_parser("bench", help="compare recipes: time to a target, many seeds, honest statistics",
                       description="Run each recipe for several seeds, each run in its own process, seeds paired "
                       "and recipes interleaved; report time to target and the fixed-budget comparison. "
                       "RECIPE may carry overrides joined with '+': name+optimizer.lr=2e-3. Items with '=' "
                       "are overrides for every recipe. Rerunning continues a stopped comparison.")
    b.add_argument("items", nargs="+", metavar="RECIPE|KEY=VALUE")
    b.add_argument("--target", default="@first-worst", help="e.g. 'val/acc>=0.908', 'val/loss<=1.9', or "
                   "'val/loss<=@first-worst' (the first recipe's worst final value; '@first': its mean); default "
                   "@first-worst on the task's own metric (accuracy up, loss down)")
    b.add_argument("--seeds", type=int, default=3, help="runs per recipe (default 3)")
    b.add_argument("--seed0", type=int, default=0, help="first seed (default 0)")
    b.add_argument("--eval-every", help="the same evaluation cadence for every recipe, e.g. 25000sp or 16000tok")
    b.add_argument("--cap", type=float, help="time cap per run in seconds (a capped run keeps its evaluations)")
    b.add_argument("--out", default="bench-results", help="results folder (default bench-results)")
    b.add_argument("--name", help="sub-folder name for this comparison")
    b.add_argument("--title", help="report title")
    b.add_argument("--ladder", metavar="TARGET_RECIPE", help="ladder from the first recipe to this one")
    b.add_argument("--nproc", type=_nproc_list, default=[1], metavar="N[,M...]", help="train every run "
                   "data-parallel in N processes on this machine (under torchrun; default 1); several sizes, "
                   "e.g. 1,2, run every recipe at each, side by side")
    b.add_argument("--order", help="ladder step order, comma-separated step names")
    b.add_argument("--keep-checkpoints", metavar="DIR", help="keep each run's final checkpoint, in DIR/LABEL-seedN "
                   "(a run folder that trainer.load_path reads, e.g. to fine-tune both sides); default: none written")
    _trust_flag(b)
    b.set_defaults(func=_cmd_bench)
    c = sub.add_parser("compress", help="prune and quantize a trained run; write an artifact and a report",
                       description="Rebuild a run's model from its recipe, load its last checkpoint (or the one "
                       "given), compress it (structured pruning, then unstructured, then fine-tuning, then "
                       "quantization), evaluate before and after, measure CPU inference, and write an artifact "
                       "with a report (markdown and JSON) beside it. Overrides (KEY=VALUE) change the stored "
                       "recipe, e.g. data.path=... where the data lies on this machine.")
    c.add_argument("source", metavar="RUN_OR_CHECKPOINT", help="a run folder of hasten train, or a checkpoint in one")
    c.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE", help="recipe overrides (e.g. data.path=...)")
    c.add_argument("--prune", type=_fraction, default=0.0, metavar="S", help="unstructured magnitude pruning to "
                   "sparsity S in [0, 1) of the prunable weights (stem and head stay dense)")
    c.add_argument("--scope", choices=("global", "layer"), default="global",
                   help="--prune with one threshold over all layers (global, default) or per layer")
    c.add_argument("--structured", type=_fraction, default=0.0, metavar="R", help="remove the fraction R of the "
                   "channels (conv nets) or MLP units and heads (GPT, BERT) of every layer: a smaller model")
    c.add_argument("--multiple-of", type=int, metavar="N", help="--structured keeps a multiple of N "
                   "units in each layer of 4N or more (default 16, the widths kernels run fastest; 1: exactly R)")
    c.add_argument("--quantize", choices=("int8", "int8-weight", "int8-static"), help="int8: dynamic int8 "
                   "activations and weights for Linear layers; int8-weight: weights only; int8-static: "
                   "calibrated int8 convolutions and linears for x86 (torchao)")
    c.add_argument("--finetune", metavar="DURATION", help="fine-tune after pruning for a typed time, e.g. 200ba or 1ep")
    c.add_argument("--finetune-lr", type=float, default=0.1, metavar="F",
                   help="fine-tune at F times the recipe's learning rates, decaying to 0 (default 0.1)")
    c.add_argument("--out", metavar="FILE", help="artifact path (default RUN/compressed/<what was done>.hasten)")
    c.add_argument("--export", action="store_true", help="also write a torch.export program (FILE.pt2)")
    c.add_argument("--no-latency", action="store_true", help="skip the CPU inference measurement")
    c.add_argument("--repeats", type=int, default=7, help="timed runs per model, path and batch (default 7)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar for the fine-tune")
    _trust_flag(c)
    c.set_defaults(func=_cmd_compress)
    e = sub.add_parser("eval", help="evaluate a compressed artifact on its recipe's evaluation data",
                       description="Rebuild the model an artifact describes and evaluate it as the run did.")
    e.add_argument("artifact", metavar="ARTIFACT")
    e.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE", help="recipe overrides (e.g. data.path=...)")
    _trust_flag(e)
    e.set_defaults(func=_cmd_eval)
    u = sub.add_parser("tune", help="measure the systems settings on this machine; write the fastest recipe",
                       description="Search precision, channels-last, compilation, the data path, threads, the host "
                       "allocator and micro-batches for a recipe on this machine, each option timed in its own "
                       "process with warm-up excluded and options interleaved; a quality guard for options that "
                       "change the arithmetic; writes a table, a plot and tuned.yaml (docs/tune.md). --lr runs a "
                       "learning-rate range test instead.")
    u.add_argument("recipe", metavar="RECIPE")
    u.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE", help="recipe overrides")
    u.add_argument("--budget", default="10m", help="wall-clock budget of the search (default 10m)")
    u.add_argument("--out", metavar="DIR", help="results folder (default tune-results/RECIPE)")
    u.add_argument("--fresh", action="store_true", help="measure again instead of printing the cached result")
    u.add_argument("--min-gain", default="5%", metavar="G", help="the least projected gain in the whole run's time "
                   "an option must show to be handed over, e.g. 5%% or 0.05 (default 5%%)")
    u.add_argument("--methods", action="store_true", help="after the systems settings, measure hasten's methods that "
                   "fit the model as time to the recipe's quality (30%% of --budget for the systems, the rest for the "
                   "methods: half of that screens candidates at one run each, the other half verifies the most promising "
                   "over three seeds; the report names the --budget that screens them all)")
    u.add_argument("--lr", action="store_true", help="a learning-rate range test instead of the systems search")
    u.add_argument("--lr-steps", type=int, default=200, help="--lr: steps of the sweep (default 200)")
    _trust_flag(u)
    u.set_defaults(func=_cmd_tune)
    dp = sub.add_parser("data", help="prepare data that does not fit one machine, for streaming",
                        description="Data for streamed training (docs/streaming.md).")
    dsub = dp.add_subparsers(dest="data_command", metavar="ACTION")
    pr = dsub.add_parser("prepare", help="write a source as Parquet shards with a manifest, locally or to an "
                         "object store", description="Write SOURCE as a prepared source at --out: token windows "
                         "(a text corpus, with its BPE) or raw uint8 images with labels, in Parquet shards of about "
                         "--shard-mb MiB and a manifest (hasten-stream.json), so recipes stream it with "
                         "data.source=OUT (language models) or data.stream=OUT (images). --out is a folder or an "
                         "fsspec URL (s3://bucket/prefix; S3-compatible servers through AWS_ENDPOINT_URL). It "
                         "must be empty, or hold a source prepared with the same settings.")
    pr.add_argument("source", metavar="SOURCE", help="prose, a text corpus (.txt, a folder or archive of .txt, "
                    ".jsonl(.gz)), cifar10, a CIFAR-10 archive or image zip, or an image folder with train/ and val/")
    pr.add_argument("--out", required=True, metavar="DIR|URL", help="where to write it (a folder, s3://...)")
    pr.add_argument("--block-size", type=int, default=256, help="text: tokens a window (default 256)")
    pr.add_argument("--vocab-size", type=int, default=8192, help="text: the BPE vocabulary (default 8192)")
    pr.add_argument("--val-every", type=int, default=10, help="text: every Nth document to validation (default 10)")
    pr.add_argument("--text-field", default="text", help="text from .jsonl: the field holding it (default text)")
    pr.add_argument("--shard-mb", type=float, default=64.0, help="size of a shard in MiB (default 64)")
    pr.add_argument("--seed", type=int, default=0, help="the shuffle of the training rows (default 0)")
    pr.add_argument("--no-progress", action="store_true", help="no progress bar")
    pr.set_defaults(func=_cmd_data_prepare)
    dp.set_defaults(func=lambda args: (dp.print_help(), 2)[1])
    r = sub.add_parser("recipes", help="list the packaged recipes")
    r.set_defaults(func=_cmd_recipes)
    return p


class _GoneReader:
    """Standard output that survives its reader going away (`hasten train | head -n 3`): the
    first write that finds the pipe closed points the descriptor at /dev/null, says so once on
    standard error, and training goes on (its checkpoints and logs are files; only the text
    printed for the reader is dropped)."""

    def __init__(self, stream):
        self._stream, self._gone = stream, False

    def _closed(self) -> None:
        if not self._gone:
            self._gone = True
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self._stream.fileno())
                os.close(devnull)
            except (OSError, ValueError):
                pass
            print("hasten: standard output was closed (its reader stopped); the run goes on and its output "
                  "is dropped", file=sys.stderr, flush=True)

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._closed()
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._closed()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _unknown_one_line(e: BaseException) -> str:
    """An error hasten does not know, as 'Type: message'; one raised in a loader worker (torch
    re-raises it with the worker's whole traceback as its message) as the worker's own type and
    message, and where it was raised."""
    carried = worker_report(str(e))
    if carried is None:
        return f"{type(e).__name__}: {_one_line(e)}"
    return f"{carried.type_name}: {' '.join(carried.message.split())} (raised {carried.where})"


# options whose value is a quantity: a negative one ('--budget -5m') is passed to the option, whose
# own check then names the problem, instead of argparse taking it for an unknown flag
QUANTITY_OPTIONS = ("--budget", "--min-gain", "--eval-every", "--cap")


def _attach_negative_values(argv: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        if argv[i] in QUANTITY_OPTIONS and i + 1 < len(argv) and re.fullmatch(r"-\.?\d[\w.%]*", argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """hasten's own warnings as one line, `hasten: warning: ...`; others as Python shows them."""
    if f"{os.sep}hasten{os.sep}" in str(filename) and category is UserWarning:
        print(f"hasten: warning: {message}", file=file or sys.stderr)
    else:
        _SHOW_WARNING(message, category, filename, lineno, file, line)


_SHOW_WARNING = warnings.showwarning


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    argv = _attach_negative_values(list(sys.argv[1:] if argv is None else argv))
    # options may come between positionals ('bench a --ladder b key=value'), as in most CLIs
    args, rest = parser.parse_known_args(argv)
    extra = "items" if getattr(args, "items", None) is not None else "overrides"
    if rest and (any(r.startswith("-") for r in rest) or getattr(args, extra, None) is None):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if rest:
        setattr(args, extra, getattr(args, extra) + rest)
    args.argv = argv[1:]
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # a recipe name that looks like an override means the default recipe was meant
    if args.command == "train":
        args.recipe_given = args.recipe is not None and "=" not in args.recipe
        if args.recipe is not None and "=" in args.recipe:
            args.overrides = [args.recipe] + args.overrides
            args.recipe = None
        args.recipe = args.recipe or DEFAULT_RECIPE
    debug = args.debug or os.environ.get("HASTEN_DEBUG", "") not in ("", "0")
    stdout, trust_before, show = sys.stdout, os.environ.get(TRUST_ENV), warnings.showwarning
    if not debug:
        warnings.showwarning = _show_warning
    if getattr(args, "trust_code", False):
        trust_code_here_and_in_workers()
    if stdout is not None and not isinstance(stdout, _GoneReader):
        sys.stdout = _GoneReader(stdout)
    try:
        code = _run(args, debug)
    finally:
        sys.stdout, warnings.showwarning = stdout, show
        if trust_before is None:   # main() called in a process that goes on: the flag was for this command
            os.environ.pop(TRUST_ENV, None)
    leave_worker(code)   # a torchrun worker exits here, its work done (see leave_worker)
    return code


def _run(args, debug: bool) -> int:
    try:
        return args.func(args)
    except HastenError as e:
        if debug:
            raise
        print(f"hasten: error: {_one_line(e)}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    except KeyboardInterrupt:
        if debug:
            raise
        print("hasten: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("hasten: stopped by SIGTERM", file=sys.stderr)
        return 143
    except Exception as e:   # not a user mistake we know of: still one line, the traceback on request
        if debug:
            raise
        print(f"hasten: error: {_unknown_one_line(e)} (run again with --debug for the traceback; "
              "if it looks like a bug in hasten, please report it with that traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
