"""`cifar10-fast` against a peer, side by side on one machine: airbench94_muon (the default,
`--peer muon`, Keller Jordan's record procedure until 2025), the Hive's newest record (`--peer
hive`, 5cd49b1: 0.778x airbench94_muon's time on an A100) or the older airbench94 (`--peer
airbench94`).

Equal terms (`--systems equal`, the default): both sides run in processes started with the
same environment, which includes hasten's host allocator settings as glibc's MALLOC_*
variables (what `hasten train` applies on a CPU; hasten leaves the allocator alone when they
are set), the same threads (torch's default) and no other difference: the headline of every
peer row. `--systems as-shipped` runs hasten as shipped against the peer as published (glibc's
defaults for the peer): a labelled second arm, never the headline.

Runs alternate (peer seed 0, hasten seed 0, peer seed 1, ...), each in its own process, so
slow spells of a shared machine fall on both. hasten's runs go through `hasten bench` (its runs
land in the result's folder, benchmarks/results/vision/<date>-<machine>-<name>/runs.jsonl);
the peer's through peers/airbench94_muon.py (or peers/hive_cifar10.py, peers/airbench94_cpu.py),
appended to peer.jsonl in the same folder; the table goes to docs/results/vision/<same>.md.
When the comparison is finished, `python -m benchmarks.tools.results archive FOLDER` packs the
logs and puts hasten bench's own report under the table. Every record carries its provenance (commit, machine, start
time, the comparison it was made for: hasten.provenance), and the report's sentence about the
order of the runs is derived from those fields. Both sides time the same work, upstream's
boundaries: the whitening fit, training with its per-epoch data augmentation, and the final
test-time-augmented evaluation; per-epoch evaluations, reading the dataset from disk and
one-off warm-up are not timed. Rerunning continues where a stopped comparison left off.

    python -m benchmarks.comparisons.cifar10_cpu_vs_peer --data cifar10-jpeg.zip --seeds 3 --peer-seeds 3 [--peer muon]

On a GPU (`--device cuda`) the peer runs as published: fp16 weights, compiled with mode
max-autotune, Newton-Schulz compiled, cudnn.benchmark, fused SGD; one process for all its
seeds after one whole untimed warm-up run (its compilation), timed with CUDA events. hasten's
runs take the recipe as given (`--recipe cifar10-fast-gpu`, whose compilation falls in the
untimed warm-up of each run). A dedicated GPU has no neighbours to share slow spells with, so
the peer's seeds run first, then hasten's.

    python -m benchmarks.comparisons.cifar10_cpu_vs_peer --device cuda --data cifar10-jpeg.zip --seeds 3 --peer-seeds 3 \
        --recipe cifar10-fast-gpu --name cifar10-fast-gpu-vs-muon-h100
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.tools import results as record  # noqa: E402
from benchmarks.tools.common import glibc_env, hasten_malloc, result_folder, write_results  # noqa: E402

from hasten.bench.stats import ratio_ci  # noqa: E402
from hasten.provenance import order_sentence  # noqa: E402

# --peer: (script under peers/, name in tables)
PEERS = {"muon": ("airbench94_muon.py", "airbench94_muon"),
         "hive": ("hive_cifar10.py", "the Hive's cifar10-speedrun (5cd49b1)"),
         "airbench94": ("airbench94_cpu.py", "airbench94 (the older procedure)")}
HASTEN_MALLOC = hasten_malloc()


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _stats(xs: list[float]) -> str:
    if not xs:
        return "–"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.{4 if xs[0] < 1.5 else 1}f} ± {sd:.{4 if xs[0] < 1.5 else 1}f} ({min(xs):.4g}–{max(xs):.4g})"


def final_eval_s(r: dict) -> float:
    """The seconds of a hasten run's evaluation at its last batch (its final evaluation) that its
    timed work does not already hold: an algorithm that counts its evaluation work as method
    time (test-time augmentation) put that part in method_setup_s, hence in timed work.
    Records made before `eval_method_s` was recorded held TTA's whole final evaluation in
    method_setup_s (TTA times from its eval_start to its eval_end); for those, a final
    evaluation that is not longer than method_setup_s is taken as counted already."""
    last = [e for e in r.get("evals", []) if e.get("batch") == r["final"]["batch"]]
    if not last:
        return 0.0
    e = last[-1]
    if "eval_method_s" in e:
        return max(0.0, e.get("eval_s", 0.0) - e["eval_method_s"])
    return 0.0 if e.get("eval_s", 0.0) <= r["final"].get("method_setup_s", 0.0) else e.get("eval_s", 0.0)


def _hasten_allocator(r: dict) -> str:
    """How a hasten run's allocator was set, from its record: hasten's settings (applied by hasten,
    or given as MALLOC_* variables it left alone) or glibc's defaults."""
    state = str(((r.get("final") or {}).get("machine") or {}).get("host_allocator") or "")
    if "MALLOC_" in state or "tuned" in state or "applied" in state:
        return "hasten's allocator settings"
    return "allocator: " + (state or "not recorded")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="CIFAR-10 (official archive or folder, or an image-folder zip)")
    ap.add_argument("--seeds", type=int, default=5, help="hasten runs")
    ap.add_argument("--peer-seeds", type=int, default=3, help="peer runs")
    ap.add_argument("--seed0", type=int, default=0,
                    help="first seed of both sides (fresh seeds test a configuration chosen on seeds 0-2)")
    ap.add_argument("--recipe", default="cifar10-fast")
    ap.add_argument("--systems", choices=("equal", "as-shipped"), default="equal",
                    help="equal (default): both sides under the same environment, hasten's allocator settings "
                         "included; as-shipped: hasten as shipped against the peer under glibc's defaults")
    ap.add_argument("--peer-precision", choices=("auto", "bf16", "fp32", "fp16"), default="auto",
                    help="the peer's precision; auto follows the same rule as hasten's precision: auto")
    ap.add_argument("--target", default="val/acc>=0.908")
    ap.add_argument("--peer", choices=tuple(PEERS), default="muon",
                    help="muon: airbench94_muon (default); hive: the Hive's newest record; airbench94: the older "
                         "SGD and Lookahead procedure")
    ap.add_argument("--name", default=None, help="results name (default cifar10-fast-cpu-vs-PEER, with "
                    "-as-shipped for --systems as-shipped)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the peer as published (compiled), all its seeds in one process after one warm-up run")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: the table from the runs already recorded under --name")
    args = ap.parse_args(argv)

    args.name = args.name or f"cifar10-fast-cpu-vs-{args.peer}" + ("-as-shipped" if args.systems == "as-shipped" else "")
    peer_module = "benchmarks.comparisons.peers." + PEERS[args.peer][0].removesuffix(".py")
    folder = result_folder(args.name, "vision")
    folder.mkdir(parents=True, exist_ok=True)
    peer_log = folder / "peer.jsonl"
    # one environment for both sides: glibc's MALLOC_* variables are hasten's settings (equal terms) or absent
    env = {**glibc_env(), **(HASTEN_MALLOC if args.systems == "equal" else {})}
    if args.report_only:
        args.seeds = args.peer_seeds = 0
    order = len(_read_jsonl(peer_log)) + len(_read_jsonl(folder / "runs.jsonl"))   # runs already in this comparison
    peer_args = ["--data", args.data, "--precision", args.peer_precision, "--comparison", args.name]
    if args.device == "cuda" and args.peer_seeds:   # one process, one warm-up (compilation) for all the peer's missing seeds
        done = {r["seed"] for r in _read_jsonl(peer_log)}
        missing = [args.seed0 + i for i in range(args.peer_seeds) if args.seed0 + i not in done]
        if missing:
            print(f"peer seeds {missing[0]}-{missing[-1]} (cuda, compiled as published)", flush=True)
            subprocess.run([sys.executable, "-m", peer_module, *peer_args, "--seed0", str(missing[0]),
                            "--seeds", str(len(missing)), "--out", str(peer_log), "--device", "cuda", "--compile",
                            "--order", str(order)], env=env, check=True)
            order += len(missing)
    for i in range(max(args.seeds, args.peer_seeds)):
        seed = args.seed0 + i
        done = {r["seed"] for r in _read_jsonl(peer_log)}
        if args.device == "cpu" and i < args.peer_seeds and seed not in done:
            print(f"peer seed {seed} ({args.systems} systems)", flush=True)
            subprocess.run([sys.executable, "-m", peer_module, *peer_args, "--seed0", str(seed), "--seeds", "1",
                            "--out", str(peer_log), "--order", str(order)], env=env, check=True)
            order += 1
        if i < args.seeds:
            print(f"hasten seed {seed}", flush=True)
            before = len(_read_jsonl(folder / "runs.jsonl"))
            subprocess.run([sys.executable, "-m", "hasten.cli", "bench", args.recipe, f"data.path={args.data}",
                            "--seed0", str(args.seed0), "--seeds", str(i + 1),
                            "--target", args.target, "--out", os.path.relpath(folder.parent), "--name", folder.name],
                           check=True, stdout=subprocess.DEVNULL, env=env)
            order += len(_read_jsonl(folder / "runs.jsonl")) - before

    ours = [r for r in _read_jsonl(folder / "runs.jsonl") if r.get("final")]
    from hasten.bench.report import final_metric, timed_duration
    rows, data = [], {"hasten": [], "peer": {}}
    o_acc = [final_metric(r, "val/acc") for r in ours]
    # the final augmented evaluation is timed on both sides, once: hasten's bench leaves evaluations out
    # of its timed work but counts test-time augmentation's as method time; what is not counted is added
    o_t = [timed_duration(r) + final_eval_s(r) for r in ours]
    data["hasten"] = [{"seed": r["seed"], "acc": a, "timed_s": t} for r, a, t in zip(ours, o_acc, o_t)]
    allocs = sorted({_hasten_allocator(r) for r in ours})
    rows.append(f"| hasten `{args.recipe}` ({', '.join(allocs)}) | {len(ours)} | {_stats(o_acc)} | {_stats(o_t)} | – |")
    peers = _read_jsonl(peer_log)
    sides = {"hasten": ours}
    for malloc in (False, True):
        runs = [r for r in peers if bool(r.get("malloc_env")) == malloc]
        if not runs:
            continue
        acc, t = [r["acc_tta"] for r in runs], [r["timed_s"] for r in runs]
        ci = ratio_ci(o_t, t) if o_t else None   # hasten's time over the peer's (geometric means), 95% Welch interval
        ratio = (f"{ci['ratio']:.3f} [{ci['low']:.3f}, {ci['high']:.3f}]" if ci and ci["low"] == ci["low"]
                 else f"{ci['ratio']:.3f}" if ci else "–")
        precisions = "/".join(sorted({r.get("precision", "bf16") for r in runs}))
        where = "/".join(sorted({(r.get("provenance") or {}).get("machine", {}).get("gpu") or r.get("gpu") or "CPU"
                                 for r in runs}))
        compiled = ", compiled" if any(r.get("compiled") for r in runs) else ""
        alloc = "hasten's allocator settings" if malloc else "glibc's allocator defaults"
        like = "like for like" if malloc and allocs == ["hasten's allocator settings"] else "not like for like"
        label = f"{PEERS[args.peer][1]}, {where} ({precisions}{compiled}; {alloc}: {like})"
        rows.append(f"| {label} | {len(runs)} | {_stats(acc)} | {_stats(t)} | {ratio} |")
        data["peer"]["hasten_malloc" if malloc else "default_malloc"] = [
            {"seed": r["seed"], "acc": r["acc_tta"], "timed_s": r["timed_s"], "parts_s": r["parts_s"],
             "provenance": r.get("provenance")} for r in runs]
        sides[f"the peer ({alloc})"] = runs
    data["order"] = order_sentence(sides, args.name)
    commits = ", ".join(sorted({((r.get("final") or {}).get("code") or {}).get("commit", "?")[:7] for r in ours}))
    data_link = os.path.relpath(folder, record.REPORTS / folder.parent.name) + "/"
    md = (f"# `{args.recipe}` against {PEERS[args.peer][1]}\n\n"
          + f"Order of the runs: {data['order']} Each run in its own process. Test accuracy with test-time "
          "augmentation; timed work: whitening fit, training with its data augmentation and the final augmented "
          "evaluation (per-epoch evaluation, reading the data and one-off warm-up not timed). Ratio: hasten's timed "
          "work over the peer's (geometric means, 95% Welch interval on log times). Like for like: both sides under "
          "the same allocator settings and environment.\n\n"
          "| run | seeds | test acc (mean ± std, min–max) | timed s (mean ± std, min–max) | hasten / peer time |\n"
          "|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
          + ("hasten bench's report of hasten's runs: below, once the result is archived; " if ours else "")
          + f"runs: [the data folder]({data_link}) (`runs.jsonl` hasten's, `peer.jsonl` the peer's). "
          + (f"hasten's runs ran at commit {commits}; " if ours else "No hasten runs under this name; ")
          + "the table is computed from the records by the command below"
          + (" (`--report-only`: rendered where the command ran, from runs made on the machine the records name)"
             if args.report_only else "") + ".\n")
    j, m = write_results(args.name, data, md, "vision")
    print(m.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
