"""`prose-gpt-fast` against modded-nanogpt's procedure at its scale, side by side on one machine.

The peer is benchmarks/comparisons/peers/modded_nanogpt.py (hasten's rendering of upstream's
train_gpt.py, its deviations listed there); hasten's side is `hasten bench prose-gpt-fast`, as a
user runs it. Both read the same tokens: this script tokenizes hasten's prose corpus with the
recipe's tokenizer (hasten.data.corpus, every tenth document held out) and hands the peer the
token arrays. Both are scored with the same metric (the mean cross-entropy over the first
131,072 held-out tokens in windows of 256: hasten's val/loss).

Equal terms: both sides run in processes started with the same environment, hasten's host
allocator settings included as glibc's MALLOC_* variables (hasten leaves the allocator alone
when they are set), the same threads, neither compiled. Runs alternate (peer seed 0, hasten
seed 0, peer seed 1, ...), each in its own process.

Target: the peer's worst final val/loss. hasten's time to it is the timed training (warm-up
and evaluations excluded) at its first evaluation at or under it (evaluations every
--eval-every batches); the peer's is its whole timed training (its procedure is a fixed
schedule: its final loss is what it reaches). Ratio: hasten's time over the peer's (geometric
means, 95% Welch interval on log times); a hasten run that never reaches the target counts
at its whole timed duration and is reported as a miss. Rerunning continues a stopped
comparison.

    python -m benchmarks.comparisons.lm_vs_modded --seeds 3
    python -m benchmarks.comparisons.lm_vs_modded --report-only
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.tools import results as record  # noqa: E402
from benchmarks.tools.common import glibc_env, hasten_malloc, result_folder, write_results  # noqa: E402

from hasten.bench.report import final_metric, time_to_target, timed_duration  # noqa: E402
from hasten.bench.stats import ratio_ci  # noqa: E402
from hasten.bench.target import Target  # noqa: E402
from hasten.provenance import order_sentence  # noqa: E402

PEER = "modded-nanogpt (hasten's rendering of 40fe836 at this scale)"


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _stats(xs: list[float], digits: int) -> str:
    if not xs:
        return "–"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.{digits}f} ± {sd:.{digits}f} ({min(xs):.{digits}f}–{max(xs):.{digits}f})"


def write_tokens(path: Path) -> None:
    """The prose corpus as prose-gpt-fast sees it: BPE of 8,192 trained on the training documents,
    every tenth document held out, packed with end-of-document tokens."""
    from hasten.data.corpus import tokenized_corpus
    c = tokenized_corpus("prose", vocab_size=8192)
    np.savez(path, train=c.train_tokens.astype(np.int32), val=c.val_tokens.astype(np.int32))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="runs of each side")
    ap.add_argument("--recipe", default="prose-gpt-fast")
    ap.add_argument("--eval-every", default="20ba", help="hasten's evaluation interval (for its time to target)")
    ap.add_argument("--name", default="prose-gpt-fast-vs-modded")
    ap.add_argument("--report-only", action="store_true", help="run nothing: the table from the runs recorded")
    args = ap.parse_args(argv)
    folder = result_folder(args.name, "language-models")
    folder.mkdir(parents=True, exist_ok=True)
    peer_log, runs_log = folder / "peer.jsonl", folder / "runs.jsonl"
    env = {**glibc_env(), **hasten_malloc()}
    order = len(_read_jsonl(peer_log)) + len(_read_jsonl(runs_log))
    with tempfile.TemporaryDirectory(prefix="modded-") as tmp:
        tokens = Path(tmp) / "tokens.npz"
        for i in range(0 if args.report_only else args.seeds):
            if i not in {r["seed"] for r in _read_jsonl(peer_log)}:
                if not tokens.exists():
                    write_tokens(tokens)
                print(f"peer seed {i}", flush=True)
                subprocess.run([sys.executable, "-m", "benchmarks.comparisons.peers.modded_nanogpt", "--tokens", str(tokens),
                                "--seed", str(i), "--out", str(peer_log), "--comparison", args.name, "--order", str(order)],
                               env=env, check=True)
                order += 1
            if len(_read_jsonl(runs_log)) <= i:
                print(f"hasten seed {i}", flush=True)
                before = len(_read_jsonl(runs_log))
                subprocess.run([sys.executable, "-m", "hasten.cli", "bench", args.recipe, "--seed0", "0", "--seeds", str(i + 1),
                                "--eval-every", args.eval_every, "--out", os.path.relpath(folder.parent), "--name", folder.name],
                               check=True, stdout=subprocess.DEVNULL, env=env)
                order += len(_read_jsonl(runs_log)) - before

    peers = _read_jsonl(peer_log)
    ours = [r for r in _read_jsonl(runs_log) if r.get("final")]
    data: dict = {"peer": [{k: r[k] for k in ("seed", "val_loss", "timed_s", "tokens", "precision", "provenance")}
                           for r in peers]}
    rows = []
    if peers:
        worst = max(r["val_loss"] for r in peers)
        target = Target("val/loss", "<=", worst)
        p_t = [r["timed_s"] for r in peers]
        rows.append(f"| {PEER} | {len(peers)} | {_stats([r['val_loss'] for r in peers], 4)} | {_stats(p_t, 1)} | "
                    f"{len(peers)}/{len(peers)} | {_stats(p_t, 1)} | 1 |")
        hits, o_t = [], []
        for r in ours:
            ttt = time_to_target(r, target)
            hits.append(ttt is not None)
            o_t.append(ttt["seconds"] if ttt else timed_duration(r))
        ci = ratio_ci(o_t, p_t) if o_t else None
        ratio = (f"{ci['ratio']:.3f} [{ci['low']:.3f}, {ci['high']:.3f}]" if ci and ci["low"] == ci["low"]
                 else f"{ci['ratio']:.3f}" if ci else "–")
        if ci and not all(hits):   # a miss counts at its whole duration: the ratio is a lower bound
            ratio = f"more than {ci['ratio']:.3f} ({len(hits) - sum(hits)} of {len(hits)} missed the target)"
        finals = [final_metric(r, "val/loss") for r in ours]
        rows.append(f"| hasten `{args.recipe}` | {len(ours)} | {_stats(finals, 4)} | {_stats([timed_duration(r) for r in ours], 1)} | "
                    f"{sum(hits)}/{len(ours)} | {_stats(o_t, 1)} | {ratio} |")
        # the other reading: the peer's time to hasten's mean final loss, at the peer's first (untimed)
        # evaluation at or under it; evaluations are --eval-every apart on the peer's side, so the
        # peer's time is an upper bound and hasten's ratio to it a lower bound
        if finals:
            own = statistics.mean(finals)
            p_own = [next((c["timed_s"] for c in r.get("curve", []) if c["val_loss"] <= own), None) for r in peers]
            o_full = [timed_duration(r) for r in ours]
            if all(x is not None for x in p_own):
                ci2 = ratio_ci(o_full, p_own)
                data["at_hastens_loss"] = {"loss": own, "peer_timed_s": p_own, "hasten_timed_s": o_full, "ratio": ci2}
                rows.append(f"| the peer to hasten's mean final loss ({own:.4f}), at its first evaluation under it | "
                            f"{len(peers)} | – | – | {len(peers)}/{len(peers)} | {_stats(p_own, 1)} | hasten's whole run: "
                            f"at least {ci2['ratio']:.2f}x the peer's time to that loss |")
        data.update(target=worst, hasten=[{"seed": r["seed"], "final_val_loss": f, "timed_s": timed_duration(r),
                                           "time_to_target_s": t, "reached": h, "provenance": r.get("provenance")}
                                          for r, f, t, h in zip(ours, finals, o_t, hits)],
                    ratio=ci)
    data["order"] = order_sentence({"hasten": ours, "the peer": peers}, args.name)
    data_link = os.path.relpath(folder, record.REPORTS / folder.parent.name) + "/"
    md = (f"# `{args.recipe}` against modded-nanogpt at its scale\n\n"
          f"Order of the runs: {data['order']} Each run in its own process, both under hasten's allocator settings "
          "(like for like), neither compiled. Metric: mean cross-entropy over the first 131,072 held-out tokens of "
          "the prose corpus in windows of 256 (nats per token). Target: the peer's worst final val/loss"
          + (f" ({data['target']:.4f})" if peers else "") + ". Time to target: hasten's timed training at its first "
          f"evaluation (every {args.eval_every}) at or under the target; the peer's whole timed training. Ratio: "
          "hasten's time over the peer's (geometric means, 95% Welch interval on log times).\n\n"
          "| run | seeds | final val/loss (mean ± std, min–max) | timed s | reached | time to target s | hasten / peer time |\n"
          "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
          f"Runs: [the data folder]({data_link}) (`runs.jsonl` hasten's, `peer.jsonl` the peer's). The peer's rendering "
          "and its deviations from upstream: benchmarks/comparisons/peers/modded_nanogpt.py.\n")
    j, m = write_results(args.name, data, md, "language-models")
    print(m.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
