"""The command line: hasten train | recipes | --version."""
from __future__ import annotations

import argparse
import os
import sys
import time

DEFAULT_RECIPE = "shakespeare-char-baseline"


def _cmd_recipes(args) -> int:
    from .config import available_recipes
    recipes = available_recipes()
    width = max(map(len, recipes), default=0)
    for name, desc in recipes.items():
        print(f"{name:<{width}}  {desc}")
    return 0


def _cmd_train(args) -> int:
    from rich.console import Console

    from .build import build_run
    from .config import load_recipe
    from .core import NonFiniteLossError

    console = Console(highlight=False, soft_wrap=True)
    recipe = load_recipe(args.recipe, args.overrides)
    if args.print_config:
        import yaml

        from .config import to_dict
        print(yaml.safe_dump(to_dict(recipe), sort_keys=False), end="")
        return 0
    run = build_run(recipe, progress_bar=False if args.no_progress else None)
    state = run.trainer.state
    params = run.built.info.get("params")
    console.print(f"hasten {__import__('hasten').__version__}: recipe [bold]{recipe.name}[/] on {state.device} "
                  f"({recipe.trainer.precision}), {params:,} parameters, max_duration {state.max_duration}"
                  + (f", resuming at batch {state.timestamp.batch}" if state.timestamp.batch else ""))
    console.print(f"run folder: {run.run_dir}")
    t0 = time.perf_counter()
    try:
        run.trainer.fit()
    except NonFiniteLossError as e:
        console.print(f"[red]error:[/] {e}")
        return 1
    finally:
        run.trainer.close()
    wall = time.perf_counter() - t0
    if state.stop_reason == "sigterm":
        console.print(f"stopped by SIGTERM after batch {state.timestamp.batch}; checkpoint: {state.last_checkpoint}. "
                      f"Resume with: hasten train {args.recipe} trainer.run_dir={run.run_dir} trainer.autoresume=true")
        return 0
    metrics = "  ".join(f"{k}={v:.4f}" for k, v in state.eval_metrics.items())
    console.print(f"done in {wall:.1f} s ({state.timestamp.batch} batches, {state.timestamp.train_seconds:.1f} s training)"
                  + (f"; stopped early: {state.stop_reason}" if state.stop_reason else ""))
    console.print(f"final {metrics}")
    console.print(f"checkpoint: {state.last_checkpoint}")
    console.print(f"logs: {run.run_dir / 'metrics.jsonl'}"
                  + (f", TensorBoard: {run.run_dir / 'tensorboard'}" if (run.run_dir / 'tensorboard').exists() else ""))
    return 0


def make_parser() -> argparse.ArgumentParser:
    from . import __version__
    p = argparse.ArgumentParser(prog="hasten", description="Fast PyTorch training with measured speedups.")
    p.add_argument("--version", action="version", version=f"hasten {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    t = sub.add_parser("train", help="train a recipe", description="Train a packaged recipe or a YAML file. "
                       "Overrides are key.sub=value, e.g. trainer.max_duration=200ba optimizer.lr=3e-4.")
    t.add_argument("recipe", nargs="?", default=DEFAULT_RECIPE,
                   help=f"recipe name (see 'hasten recipes') or YAML path; default {DEFAULT_RECIPE}")
    t.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--print-config", action="store_true", help="print the resolved recipe and exit")
    t.set_defaults(func=_cmd_train)
    r = sub.add_parser("recipes", help="list the packaged recipes")
    r.set_defaults(func=_cmd_recipes)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # a recipe name that looks like an override means the default recipe was meant
    if getattr(args, "recipe", None) and "=" in args.recipe:
        args.overrides = [args.recipe] + args.overrides
        args.recipe = DEFAULT_RECIPE
    from .config import ConfigError
    from .data.download import DatasetNotFoundError
    from .checkpoint import CheckpointError
    try:
        return args.func(args)
    except (ConfigError, DatasetNotFoundError, CheckpointError, FileNotFoundError) as e:
        print(f"hasten: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    except KeyboardInterrupt:
        print("hasten: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
