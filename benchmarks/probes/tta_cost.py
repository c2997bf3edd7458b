"""What test-time augmentation costs and buys on a trained model, by `fraction`.

Loads a trained image-classification run (its checkpoint and the recipe.yaml saved beside
it), then evaluates the test set with the plain view only, with the two mirror views, and
with the six flip-and-translate views given to a fraction f of each batch (the images whose
plain view gives the smallest top-1 over top-2 probability margin; the rest keep the plain
view). `--grids 1,2` adds larger view sets for every image: the mirror pair at every shift of
a (2R+1) x (2R+1) grid (R = 1: 18 views; R = 2: 50), equally weighted, to show what views
beyond the six buy. `--scales 28,36` adds f=1's views plus the mirror pair of each image
resized to that size (at weight 1/5), to show what a change of scale at test time buys
after progressive resizing trained the network at several sizes. The host allocator is set as the Trainer sets it. Settings are interleaved round by
round; times are medians over rounds, with the ratio to full TTA (f = 1) from the same round.

    hasten train cifar10-fast                 # writes runs/<name>/checkpoints/ep9-ba225.pt
    python -m benchmarks.probes.tta_cost runs/<name>/checkpoints/ep9-ba225.pt [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.tools.common import write_results
from hasten.algorithms.progressive_resizing import resize_batch
from hasten.algorithms.tta import tta_logits
from hasten.data.augment import translate as shift
from hasten.build import recipe_runtime
from hasten.checkpoint import CheckpointIO
from hasten.config import available_recipes, load_recipe, to_dict
from hasten.loggers.mlflow import flatten
from hasten.tasks import TASKS


def changes_from_packaged(recipe) -> list[str]:
    """The trained run's settings that differ from the packaged recipe of its name, as
    overrides (`model.widths=[64, 192, 192]`), so that a result names what was measured;
    data.path is where the data lay, not a setting of the run."""
    if recipe.name not in available_recipes():
        return []
    base, run = flatten(to_dict(load_recipe(recipe.name))), flatten(to_dict(recipe))
    out = []
    for k in sorted(set(base) | set(run)):
        if k == "data.path" or base.get(k) == run.get(k):
            continue
        if k in run:
            out.append(f"{k}={run[k]}")
            continue
        parts = k.split(".")   # a setting the run dropped: name the outermost part it dropped whole
        gone = next(".".join(parts[:i]) for i in range(1, len(parts) + 1)
                    if not any(r == ".".join(parts[:i]) or r.startswith(".".join(parts[:i]) + ".") for r in run))
        if f"{gone}=null" not in out:
            out.append(f"{gone}=null")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="a checkpoint of a finished image-classification run")
    ap.add_argument("--data", help="data.path override (default: the run's own)")
    ap.add_argument("--fractions", default="1,0.5,0.3,0.2,0.15", help="translate fractions to measure")
    ap.add_argument("--translate", type=int, default=1)
    ap.add_argument("--grids", default="", help="radii R of the larger view sets to add, e.g. 1,2 (default none)")
    ap.add_argument("--scales", default="", help="image sizes S in px of a rescaled mirror pair to add to f=1's "
                    "views at weight 1/5, e.g. 28,36 (default none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="tta_cost")
    args = ap.parse_args(argv)

    def whole_numbers(flag: str, text: str, example: str, each: str, least: int, unit: str = "") -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v]
        except ValueError:
            ap.error(f"{flag} takes whole numbers separated by commas, e.g. {example}; got {text!r}")
        if any(v < least for v in values):
            ap.error(f"{flag}: each {each} must be at least {least}{unit}, got {text!r}")
        return values

    radii = whole_numbers("--grids", args.grids, "1,2", "radius", 1)
    sizes = whole_numbers("--scales", args.scales, "28,36", "size", 8, " px")

    ckpt = Path(args.checkpoint)
    recipe_file = ckpt.parent.parent / "recipe.yaml"
    if not recipe_file.is_file():
        raise SystemExit(f"no recipe.yaml beside {ckpt.parent}: pass a checkpoint inside a hasten run folder")
    recipe = load_recipe(str(recipe_file), [f"data.path={args.data}"] if args.data else [])
    runtime = recipe_runtime(recipe)
    device = runtime.device
    built = TASKS[recipe.task].build(recipe, runtime)
    model = built.model
    model.load_state_dict(CheckpointIO().load(ckpt)["model"])
    model = model.to(device, memory_format=torch.channels_last).eval()
    bf16 = runtime.precision == "bf16-mixed"
    batches = [(x.to(device), y.to(device)) for x, y in built.eval_dataloader]

    # (name, translate, fraction, flip, grid radius: 0 for tta_logits' views, rescaled size: 0 for none)
    settings = [("plain", 0, 1.0, False, 0, 0), ("mirror", 0, 1.0, True, 0, 0)] + [
        (f"f={f:g}", args.translate, float(f), True, 0, 0) for f in map(float, args.fractions.split(","))] + [
        (f"grid {2 * r + 1}x{2 * r + 1}", 0, 1.0, True, r, 0) for r in radii] + [
        (f"f=1 + {v} px pair", args.translate, 1.0, True, 0, v) for v in sizes]

    def grid_logits(x, r):   # the mirror pair at every shift within r pixels, equal weights
        n, total = x.shape[0], 0
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                z = shift(x, torch.full((n,), dy, device=x.device), torch.full((n,), dx, device=x.device), r)
                z = z.contiguous(memory_format=torch.channels_last)
                total = total + model(z).float() + model(z.flip(-1)).float()
        return total / (2 * (2 * r + 1) ** 2)

    def scaled_pair(x, size):   # the image and its mirror resized to size px (area down, bilinear up)
        z = resize_batch(x, size / x.shape[-1], size_increment=1).contiguous(memory_format=torch.channels_last)
        return (model(z).float() + model(z.flip(-1)).float()) / 2

    @torch.no_grad()
    def predict(translate, fraction, flip, grid, size):
        out = []
        with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
            for x, _ in batches:
                if grid:
                    out.append(grid_logits(x, grid))
                    continue
                logits = tta_logits(model, x, flip=flip, translate=translate, fraction=fraction).float()
                out.append(0.8 * logits + 0.2 * scaled_pair(x, size) if size else logits)
        return torch.cat(out).float()

    labels = torch.cat([y for _, y in batches])
    predict(0, 1.0, False, 0, 0)                            # warm-up
    times = {s[0]: [] for s in settings}
    preds = {}
    for _ in range(args.rounds):
        for name, *how in settings:
            t0 = time.perf_counter()
            logits = predict(*how)
            times[name].append(time.perf_counter() - t0)
            preds[name] = logits.argmax(-1)
    full = "f=1" if "f=1" in preds else None
    rows, data = [], []
    for name, translate, fraction, flip, grid, size in settings:
        acc = (preds[name] == labels).float().mean().item()
        differ = int((preds[name] != preds[full]).sum()) if full else None
        ratio = statistics.median(a / b for a, b in zip(times[name], times[full])) if full else None
        views = (2 * (2 * grid + 1) ** 2 if grid else
                 1 + ((2 if flip else 1) * (3 if translate else 1) - 1) * fraction + (2 if size else 0))
        t = statistics.median(times[name])
        data.append({"setting": name, "views_per_image": views, "acc": acc, "differ_from_full": differ,
                     "time_s": t, "times_s": times[name], "ratio_to_full": ratio})
        rows.append(f"| {name} | {views:g} | {100 * acc:.2f} | {'–' if differ is None else differ} | {t:.2f} | "
                    f"{'–' if ratio is None else f'{ratio:.3f}'} |")
    changed = changes_from_packaged(recipe)
    md = (f"# Test-time augmentation: cost and accuracy by translate fraction\n\n"
          f"Trained run: recipe `{recipe.name}`"
          + (f" with {', '.join(f'`{c}`' for c in changed)}" if changed else "")
          + f", checkpoint `{ckpt.name}`; {len(labels)} test images, "
          f"{'bf16 autocast' if bf16 else 'fp32'}, channels-last, {args.rounds} interleaved rounds "
          f"(median time; ratio to f=1 from the same round). f: the fraction of each batch, least sure "
          f"by the plain view first, that also gets the mirror and the four views translated by "
          f"±{args.translate} px; the rest keep the plain view's logits. A grid: every image, the mirror pair at "
          f"every shift of that grid, equal weights. A rescaled pair: f=1's logits at weight 4/5 and the mirror "
          f"pair of the image resized to that size at 1/5.\n\n"
          "| setting | forward passes per image | test acc % | predictions that differ from f=1 | time s | vs f=1 |\n"
          "|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    _, m = write_results(args.name, {"recipe": recipe.name, "recipe_changes": changed, "checkpoint": ckpt.name, "rows": data}, md)
    print(m.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
