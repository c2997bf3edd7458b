"""The learning-rate range test (`hasten tune RECIPE --lr`), as Lightning's LR finder and
Smith (2015) run it: train from the recipe's initial weights while every learning rate grows
exponentially, step by step, from `start` to `end` times the recipe's own; record the
training loss; stop when it diverges (above 4 times its minimum). The suggestion is the
factor where the smoothed loss falls fastest (the steepest negative slope against log of the
factor), printed with the plot. A starting point, not an answer: it ignores the schedule's
warm-up and decay, and a short test favours rates that a long run cannot sustain; check it
with `hasten bench`.
"""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from ..build import build_run
from ..config import load_recipe
from ..core import Algorithm
from ..files import atomic_write
from ..optim.compiled import lr_value, set_lr
from ..outputs import Outputs
from ..provenance import code_version


class RangeTest(Algorithm):
    """Every learning rate multiplied by start * (end / start) ** (step / steps), after the
    recipe's schedule has set it; the loss of each step recorded; the run stopped on divergence."""

    def __init__(self, start: float, end: float, steps: int):
        self.start, self.end, self.steps = start, end, steps
        self.factors: list[float] = []
        self.losses: list[float] = []
        self._base: list[float] | None = None

    def fit_start(self, state, logger):
        self._base = [lr_value(g) for o in state.optimizers for g in o.param_groups]

    def batch_start(self, state, logger):
        i = len(self.factors)
        f = self.start * (self.end / self.start) ** (i / max(1, self.steps - 1))
        for g, lr in zip((g for o in state.optimizers for g in o.param_groups), self._base):
            set_lr(g, lr * f)
        self.factors.append(f)

    def batch_end(self, state, logger):
        loss = float(state.step_losses[-1]) if state.step_losses else float("nan")
        self.losses.append(loss)
        finite = [x for x in self.losses if math.isfinite(x)]
        if not math.isfinite(loss) or (finite and loss > 4 * min(finite) and len(self.losses) > 10):
            state.stop_training = True


def smooth(xs: list[float], beta: float = 0.9) -> list[float]:
    """Exponentially smoothed, bias-corrected (as the LR finders do)."""
    out, avg = [], 0.0
    for i, x in enumerate(xs, 1):
        avg = beta * avg + (1 - beta) * x
        out.append(avg / (1 - beta ** i))
    return out


def suggest(factors: list[float], losses: list[float]) -> float | None:
    """The factor at the steepest descent of the smoothed loss (against log factor), skipping the
    first tenth and everything after the minimum."""
    pts = [(f, l) for f, l in zip(factors, smooth(losses)) if math.isfinite(l)]
    if len(pts) < 10:
        return None
    lo = len(pts) // 10
    end = min(range(len(pts)), key=lambda i: pts[i][1]) + 1
    best, slope = None, 0.0
    for i in range(max(1, lo), end):
        d = (pts[i][1] - pts[i - 1][1]) / (math.log(pts[i][0]) - math.log(pts[i - 1][0]))
        if d < slope:
            best, slope = pts[i][0], d
    return best


def lr_range_test(recipe_arg: str, overrides: list[str], steps: int = 200, start: float = 1e-3, end: float = 1e2,
                  out: "str | Path | None" = None) -> dict:
    """Run the range test of a recipe; returns {factors, losses, suggested factor, the recipe's
    learning rates and the suggested ones}, and writes lr.md, lr.json and lr.png to `out` (only
    over files a range test wrote: `hasten.outputs`)."""
    recipe = load_recipe(recipe_arg, overrides)
    outputs = Outputs(Path(out) if out else Path("tune-results") / recipe.name, "hasten tune --lr", legacy=_lr_folder)
    outputs.check(LR_FILES, "choose another --out, or move them away")
    outputs.lock("tune output folder")
    try:
        return _range_test(recipe_arg, overrides, steps, start, end, outputs)
    finally:
        outputs.unlock()


LR_FILES = ("lr.json", "lr.md", "lr.png")


def _lr_folder(folder: Path) -> bool:
    """A folder written by a range test from before the output index."""
    try:
        data = json.loads((folder / "lr.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"factors", "losses", "suggested_factor"} <= set(data)


def _range_test(recipe_arg: str, overrides: list[str], steps: int, start: float, end: float, outputs: Outputs) -> dict:
    with tempfile.TemporaryDirectory(prefix="hasten-lr-") as tmp:
        recipe = load_recipe(recipe_arg, list(overrides) + [
            f"trainer.run_dir={tmp}/run", "trainer.checkpoints=false", "trainer.tensorboard=false",
            f"trainer.max_duration={steps}ba", "trainer.log_interval=1000000ba", "schedule.name=constant",
            "schedule.warmup=0ba"])
        run = build_run(recipe, progress_bar=True, console_logger=False)
        run.trainer.eval_dataloader = None   # the test reads training losses only
        test = RangeTest(start, end, steps)
        run.trainer.add_algorithms(test)
        base = [(getattr(o, "registry_name", type(o).__name__), g.get("name", str(i)), lr_value(g))
                for o in run.trainer.state.optimizers for i, g in enumerate(o.param_groups)]
        run.trainer.fit(summary=False)
        run.close(discard=False)
    factor = suggest(test.factors, test.losses)
    result = {"recipe": recipe.name, "factors": test.factors, "losses": test.losses, "suggested_factor": factor,
              "lrs": [{"optimizer": o, "group": g, "recipe": lr, "suggested": lr * factor if factor else None}
                      for o, g, lr in base], "steps_run": len(test.losses), "start": start, "end": end,
              "code": code_version()}
    out = outputs.folder
    outputs.adopt(LR_FILES)
    outputs.claim(LR_FILES)
    atomic_write(out / "lr.json", lambda f: json.dump(result, f, indent=2), binary=False)
    said = (f"Suggested: {factor:.3g} times the recipe's learning rates." if factor else
            "No suggestion: the loss did not fall (try a wider range or more steps).")
    lines = [f"# Learning-rate range test: {recipe.name}", "",
             f"{len(test.losses)} steps, every learning rate from {start:g} to {end:g} times the recipe's.", "", said,
             "", "| optimizer | group | recipe lr | suggested lr |", "|---|---|---|---|"]
    for x in result["lrs"]:
        lines.append(f"| {x['optimizer']} | {x['group']} | {x['recipe']:.3g} | "
                     + (f"{x['suggested']:.3g} |" if x["suggested"] else "- |"))
    lines += ["", "A starting point, not an answer: check it with `hasten bench` against the recipe's own rate."]
    png = _plot(result, out / "lr.png")
    if png:
        lines += ["", f"![loss against the learning-rate factor]({png.name})"]
    atomic_write(out / "lr.md", lambda f: f.write("\n".join(lines) + "\n"), binary=False)
    outputs.record(LR_FILES)
    result["report"] = str(out / "lr.md")
    return result


def _plot(result: dict, path: Path) -> Path | None:
    try:
        import matplotlib   # optional extra: plot
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt   # optional extra: plot
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(result["factors"], result["losses"], alpha=0.35, label="loss")
    ax.plot(result["factors"], smooth(result["losses"]), label="smoothed")
    if result["suggested_factor"]:
        ax.axvline(result["suggested_factor"], color="tab:red", linestyle="--",
                   label=f"suggested {result['suggested_factor']:.3g}x")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate / the recipe's")
    ax.set_ylabel("training loss")
    ax.set_title(f"learning-rate range test: {result['recipe']}")
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    return path
