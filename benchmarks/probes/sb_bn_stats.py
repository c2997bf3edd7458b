"""Which batch statistics a model trained with selective backprop expects at evaluation.

With `selective_backprop.running_stats: scoring` (only the pass over the whole batch updates
batch norm's running statistics) `cifar10-fast` scored 0.75 points below the default `both`,
where the last update of each step comes from the hardest half (seed 0,
docs/methods/selective_backprop.md). One explanation: in the training pass every batch norm
layer normalises the hardest half by that half's own statistics, so the weights learn to
expect those statistics, and evaluation does best with running statistics of the same kind.

This takes one trained run (its final checkpoint), puts its batch norm running statistics
back to what each source below gives, and evaluates the test set with the recipe's own
evaluation (test-time augmentation included), all in fp32:

- as trained: the checkpoint's own statistics;
- whole batches: re-estimated over `--batches` training batches (augmented as in training, in
  training mode, without gradients), each layer's statistics the plain average over them;
- hardest half: the same batches, each cut to the half the model's own per-sample loss (label
  smoothing as the recipe's) ranks hardest, as selective backprop chooses;
- easiest half and a random half: the same cuts the other way and at random (the random half
  separates the effect of the batch's size from that of which samples it holds).

    python -m benchmarks.probes.sb_bn_stats RUN_FOLDER [--batches 10] [--name sb_bn_stats]
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a finished `hasten train` run folder of an image-classification recipe with batch norm")
    ap.add_argument("--batches", type=int, default=10, help="training batches the statistics are re-estimated over")
    ap.add_argument("--smoothing", type=float, default=0.2, help="label smoothing of the ranking loss (the recipe's)")
    ap.add_argument("--name", default="sb_bn_stats")
    a = ap.parse_args()
    if a.batches < 1:
        sys.exit("sb_bn_stats: --batches must be at least 1")
    from torch.optim.swa_utils import update_bn

    from hasten.algorithms._bn_stats import restore_running_stats, running_stats_of
    from hasten.compress.pipeline import eval_trainer, load_trained, locate, open_session
    from hasten.errors import HastenError
    from hasten.runs import stored_recipe
    try:
        run_dir, ckpt, _ = locate(a.run)
        session = open_session(stored_recipe(run_dir))
        meta = load_trained(session, ckpt)
    except HastenError as e:
        sys.exit(f"sb_bn_stats: {e}")
    model = session.model
    saved = running_stats_of(model)
    if not saved:
        sys.exit("sb_bn_stats: the model has no batch norm layer that keeps running statistics")

    batches = []
    for batch in session.built.train_dataloader:
        x, y = session.trainer.batch_fn(batch)
        batches.append((x.float(), y))
        if len(batches) >= a.batches:
            break
    # the cuts, chosen once by the trained model (training mode, as selective backprop scores)
    gen = torch.Generator().manual_seed(0)
    cuts = {"whole batches": [], "hardest half": [], "easiest half": [], "random half": []}
    model.train()
    with torch.no_grad():
        for x, y in batches:
            losses = F.cross_entropy(model(x).float(), y, reduction="none", label_smoothing=a.smoothing)
            order = torch.argsort(losses, descending=True)
            k = x.shape[0] // 2
            cuts["whole batches"].append(torch.arange(x.shape[0]))
            cuts["hardest half"].append(order[:k])
            cuts["easiest half"].append(order[-k:])
            cuts["random half"].append(torch.randperm(x.shape[0], generator=gen)[:k])
    restore_running_stats(saved)   # the scoring above updated them: put them back

    stamp = meta.get("timestamp")
    results = {}

    def evaluate(label: str) -> None:
        model.eval()
        metrics = eval_trainer(model, session, stamp).evaluate()
        results[label] = {k: float(v) for k, v in metrics.items()}
        print(f"{label}: " + ", ".join(f"{k} {v:.4f}" for k, v in results[label].items()), flush=True)

    evaluate("as trained")
    for label, idx in cuts.items():   # torch's own re-estimation: a plain average over the cut batches
        update_bn([x.index_select(0, i) for (x, _), i in zip(batches, idx)], model)
        evaluate(label)

    from benchmarks.tools.common import write_results
    acc = next((k for k in results["as trained"] if k.endswith("acc")), None)
    cols = list(results["as trained"])
    lines = ["# Batch norm statistics for a model trained with selective backprop", "",
             f"Run: `{run_dir.name}` (recipe `{session.recipe.name}`), its final checkpoint; running statistics "
             f"re-estimated over {a.batches} training batches of {batches[0][0].shape[0]} (augmented as in "
             "training), evaluated with the recipe's own evaluation in fp32.", "",
             "| running statistics from | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for label, r in results.items():
        lines.append(f"| {label} | " + " | ".join(f"{r[c]:.4f}" for c in cols) + " |")
    if acc:
        lines += ["", f"Change in {acc} against the checkpoint's own statistics: " + ", ".join(
            f"{label} {100 * (r[acc] - results['as trained'][acc]):+.2f} points"
            for label, r in results.items() if label != "as trained") + "."]
    md = "\n".join(lines)
    write_results(a.name, {"run": run_dir.name, "recipe": session.recipe.name, "batches": a.batches,
                           "smoothing": a.smoothing, "results": results}, md)
    print(md)


if __name__ == "__main__":
    main()
