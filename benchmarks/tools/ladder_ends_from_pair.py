"""Start a ladder with its two ends taken from a pair already measured.

A ladder's first row is the baseline recipe and its last row is the target recipe, each
under one seed: the same runs a `hasten bench BASELINE TARGET --seeds N` pair has already
made. Running them again costs the two longest rows of the ladder. This script copies the
pair's runs of one seed into the ladder's `runs.jsonl` under the ladder's row labels, after
checking that each copied run trained exactly the recipe the ladder row resolves to (only the
recipe's name and description may differ); `hasten bench --ladder`
with the same settings then runs only the rows in between. Each copied record keeps its
own log, code version and timings and says where it came from (`copied_from`).

    python -m benchmarks.tools.ladder_ends_from_pair bench-results/cifar10-vit-pair-short \\
        bench-results/ladder-cifar10-vit cifar10-vit-baseline cifar10-vit-fast \\
        data.path=.data/cifar10-jpeg.zip --eval-every 25000sp --seed 0
    hasten bench cifar10-vit-baseline --ladder cifar10-vit-fast data.path=.data/cifar10-jpeg.zip \\
        --seeds 1 --eval-every 25000sp --name ladder-cifar10-vit
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hasten.bench.ladder import ladder_specs
from hasten.bench.runner import Spec, differences, load_runs, run_identity

ALLOWED = {"recipe.name", "recipe.description"}   # what the recipe is called, not what it trains


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pair", type=Path, help="the pair's bench folder (holds runs.jsonl)")
    p.add_argument("ladder", type=Path, help="the ladder's bench folder (made if missing)")
    p.add_argument("baseline")
    p.add_argument("target")
    p.add_argument("shared", nargs="*", help="overrides given to both benches (key=value)")
    p.add_argument("--eval-every", help="the --eval-every both benches were given")
    p.add_argument("--seed", type=int, default=0, help="the seed whose runs are copied (default 0)")
    args = p.parse_args(argv)

    last = [f"trainer.eval_interval={args.eval_every}"] if args.eval_every else []
    steps = ladder_specs(args.baseline, args.target, None, args.shared, last)
    ends = [(steps[0][1], Spec.parse(args.baseline, args.shared, last)),   # (ladder row, the pair's spec)
            (steps[-1][1], Spec.parse(args.target, args.shared, last))]
    runs = [r for r in load_runs(args.pair / "runs.jsonl") if r["seed"] == args.seed and r.get("status") == "finished"]
    out = args.ladder / "runs.jsonl"
    have = {(r["label"], r["seed"]) for r in load_runs(out)}   # (no file: none)
    copied = []
    for ladder_spec, pair_spec in ends:
        found = [r for r in runs if r["label"] == pair_spec.label]
        if not found:
            sys.exit(f"{args.pair}: no finished run of {pair_spec.label} with seed {args.seed}")
        record = dict(found[-1])
        want = run_identity(ladder_spec, record["identity"].get("cap_s"))
        diff = [d for d in differences(record["identity"], want) if d.split(":")[0] not in ALLOWED]
        if diff:
            sys.exit(f"{pair_spec.label} seed {args.seed} trained other settings than ladder row "
                     f"{ladder_spec.label}: {'; '.join(diff)}")
        if (ladder_spec.label, args.seed) in have:
            print(f"{ladder_spec.label} seed {args.seed}: already in {out}")
            continue
        record.update(label=ladder_spec.label, recipe=ladder_spec.recipe, overrides=ladder_spec.overrides,
                      identity=want, copied_from={"bench": args.pair.name, "label": pair_spec.label})
        copied.append(record)
    args.ladder.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        for record in copied:
            f.write(json.dumps(record) + "\n")
            print(f"copied {record['copied_from']['label']} seed {args.seed} as ladder row {record['label']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
