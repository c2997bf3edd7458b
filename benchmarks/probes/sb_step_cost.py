"""What a selective-backprop step costs against a full one, in `cifar10-fast`'s own Trainer loop.

The recipe keeps the harder half of each batch from 40% of the run; its time model is
c = s + t, where s is the scoring pass (a forward without gradients over the whole batch) and
t the training step on the kept part, both as fractions of a full step. This times whole
Trainer steps (batch_end to batch_end, the optimizer included) at 32 px, the phase where
selection runs, for:

- full: selective backprop off (the step the recipe takes before 40%);
- keep K: the recipe's selection (keep 0.5 by default);
- keep 1.0: scoring, then the full step on the whole batch, so s = keep1 - full;
- each `--score-scale` below 1: scoring downscaled images, keep K.

Each variant is built afresh in every round, rounds interleave the variants, `--wait` steps
are dropped, the median of the next `--active` is the round's figure, and the table gives
the median over rounds with each round's value.

    python -m benchmarks.probes.sb_step_cost --data cifar10-jpeg.zip [--rounds 3] [--wait 3] [--active 6]
        [--keep 0.5] [--score-scale 0.75] [--name sb_step_cost]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time


def step_times(data_path: str, overrides: list[str], wait: int, active: int) -> list[float]:
    from hasten.build import build_run
    from hasten.config import load_recipe
    from hasten.core.callback import Callback
    with tempfile.TemporaryDirectory() as tmp:
        recipe = load_recipe("cifar10-fast", [
            f"data.path={data_path}", "algorithms.progressive_resizing=null", *overrides,
            "trainer.eval_interval=1000ep", "trainer.max_duration=1000ep", f"trainer.run_dir={tmp}/run",
            "trainer.checkpoints=false"])
        run = build_run(recipe, progress_bar=False, console_logger=False)
        marks: list[float] = []

        class Mark(Callback):
            def batch_start(self, state, logger):
                if not marks:
                    marks.append(time.perf_counter())

            def batch_end(self, state, logger):
                marks.append(time.perf_counter())
                if len(marks) > wait + active:
                    state.stop_training = True

        run.trainer.add_callbacks(Mark())
        run.trainer.eval_dataloader = None
        try:
            run.trainer.fit(summary=False)
        finally:
            run.close()
    gaps = [b - a for a, b in zip(marks, marks[1:])]
    return gaps[wait:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="the CIFAR-10 archive, folder or zip")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wait", type=int, default=3, help="steps dropped at the start of each run")
    ap.add_argument("--active", type=int, default=6, help="steps timed after them")
    ap.add_argument("--keep", type=float, default=0.5)
    ap.add_argument("--score-scale", type=float, action="append", default=[],
                    help="also time scoring at this image scale (repeatable)")
    ap.add_argument("--name", default="sb_step_cost")
    a = ap.parse_args()
    if min(a.rounds, a.active) < 1 or a.wait < 0:
        sys.exit("sb_step_cost: --rounds and --active must be at least 1, --wait at least 0")
    if not 0 < a.keep <= 1 or any(not 0 < s < 1 for s in a.score_scale):
        sys.exit("sb_step_cost: --keep must lie in (0, 1] and --score-scale in (0, 1)")
    sb = "algorithms.selective_backprop"
    variants = {"full": [f"{sb}=null"],
                f"keep {a.keep:g}": [f"{sb}.keep={a.keep}", f"{sb}.start=0dur"],
                "keep 1.0": [f"{sb}.keep=1.0", f"{sb}.start=0dur"]}
    for s in a.score_scale:
        variants[f"keep {a.keep:g}, score_scale {s:g}"] = [f"{sb}.keep={a.keep}", f"{sb}.start=0dur",
                                                           f"{sb}.score_scale={s}"]
    rounds: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(a.rounds):
        for v, ov in variants.items():
            ms = 1e3 * statistics.median(step_times(a.data, ov, a.wait, a.active))
            rounds[v].append(ms)
            print(f"round {r + 1}/{a.rounds}  {v}: {ms:.0f} ms a step", flush=True)
    from benchmarks.tools.common import write_results
    med = {v: statistics.median(xs) for v, xs in rounds.items()}
    full = med["full"]
    s = (med["keep 1.0"] - full) / full
    lines = ["# A selective-backprop step against a full one (`cifar10-fast`, 32 px, batch 2000)", "",
             f"{a.rounds} rounds, variants interleaved, each built afresh; a round's figure is the median of "
             f"{a.active} steps after {a.wait}.", "",
             "| variant | ms a step (median over rounds) | per round | against full |", "|---|---|---|---|"]
    for v, xs in rounds.items():
        lines.append(f"| {v} | {med[v]:.0f} | {', '.join(f'{x:.0f}' for x in xs)} | {med[v] / full:.3f} |")
    t = med[f"keep {a.keep:g}"] / full - s
    lines += ["", f"Scoring pass s = (keep 1.0 - full) / full = **{s:.3f}** of a full step; the training step on "
              f"the kept {a.keep:g} t = {t:.3f} (against {a.keep:g} if it scaled with the samples)."]
    md = "\n".join(lines)
    write_results(a.name, {"rounds": rounds, "median_ms": med, "scoring_fraction": s, "kept_step_fraction": t,
                           "keep": a.keep, "wait": a.wait, "active": a.active}, md)
    print(md)


if __name__ == "__main__":
    main()
