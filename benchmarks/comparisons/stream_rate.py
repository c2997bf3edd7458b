"""Step rates by data path: CIFAR-10 and the prose GPT read from memory, through a worker
DataLoader, as a prepared source streamed from a local folder, and from an S3-compatible server
(moto, on the loopback address); with 0, 1 and 2 loader workers; the share of each step spent
waiting for data; peak memory; and how long a streamed run takes to resume at step 100,000.

Each configuration is one `hasten train` process of --warmup + --steps steps, timed from its own
log (training seconds between the end of the warm-up and the last step, the run's clock);
configurations alternate over --rounds rounds, the order reversed every other round. Peak
memory is the training process's maximum resident set and, separately, the largest of its
loader workers'. The S3 server runs in this process (its CPU time competes with the runs',
as a remote store's would not: a bound on what a network store costs here, not a network).

    python -m benchmarks.comparisons.stream_rate --data .data/cifar10-jpeg.zip [--rounds 3] [--steps 20]

`--before CHECKOUT` adds, beside every streamed configuration, the same run under another
checkout's code (its `src` first on the path; e.g. `git worktree add ../before COMMIT`): what a
change of the reading path costs a step, measured in the same rounds. Every run records the
code it ran (provenance.code_version in the run's own process). `--only TEXT` keeps the
configurations whose task or path holds TEXT; `--image-shard-mb` and `--token-shard-mb` set
the shards' sizes (smaller shards put more shard reads inside the timed steps).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.tools.common import write_results

CHILD = """
import json, resource, sys
import hasten
from hasten.cli import main
from hasten.provenance import code_version
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "self_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "workers_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "code": code_version()}))
"""


def run(args: list[str], env: dict, run_dir: Path, warmup: int) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, "train", *args, f"trainer.run_dir={run_dir}", "--no-progress",
                        "trainer.log_interval=1ba", "trainer.checkpoints=false", "trainer.tensorboard=false"],
                       capture_output=True, text=True, env={**os.environ, **env}, timeout=3600)
    try:
        mem = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RuntimeError(f"run failed: {r.stderr[-800:]}") from None
    if mem["rc"] != 0:
        raise RuntimeError(f"run failed ({mem['rc']}): {r.stderr[-800:]}")
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    rows = [x for x in rows if "time/train_seconds" in x]
    first = next(x for x in rows if x["step"] >= warmup)
    last = rows[-1]
    seconds = last["time/train_seconds"] - first["time/train_seconds"]
    steps = last["step"] - first["step"]
    waits = [x["time/data_wait"] for x in rows if x["step"] > warmup and "time/data_wait" in x]
    return {"steps_per_s": steps / seconds, "data_wait": statistics.mean(waits) if waits else None,
            "peak_mb": mem["self_kb"] / 1024, "workers_peak_mb": mem["workers_kb"] / 1024, "code": mem["code"],
            "timed_steps": steps}


def resume_at(source: str, position: int, env: dict, tmp: Path) -> dict:
    """Seconds for a streamed prose GPT to produce its first batch at step `position` of the
    run (the sampler starts there: nothing before it is read), in a fresh process."""
    run_dir = Path(tempfile.mkdtemp(prefix="resume-", dir=tmp)) / "run"   # a fresh run folder for each source
    code = f"""
import json, time
t0 = time.perf_counter()
from hasten.config import load_recipe
from hasten.build import build_run
from hasten.data.resumable import epoch_iterator
r = load_recipe("prose-gpt-baseline", ["data.source={source}", "data.num_workers=0", "trainer.run_dir={run_dir}",
                                       "trainer.progress_bar=false", "trainer.tensorboard=false"])
run = build_run(r)
built = time.perf_counter()
loader = run.trainer.state.train_dataloader
per_epoch = len(loader)
epoch, skip = divmod({position}, per_epoch)
t1 = time.perf_counter()
batch = next(epoch_iterator(loader, 0, epoch, skip))
t2 = time.perf_counter()
run.close()
print(json.dumps({{"set_up_s": built - t0, "first_batch_s": t2 - t1, "epoch": epoch, "batch_in_epoch": skip,
                  "steps_per_epoch": per_epoch}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env},
                       timeout=600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-800:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="the CIFAR-10 archive or image zip")
    ap.add_argument("--corpus", default="prose", help="the text corpus of the GPT (default prose)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="timed steps a run")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--name", default="stream_rate")
    ap.add_argument("--only", action="append", help="keep the configurations whose task or path holds this text "
                    "(repeat for several)")
    ap.add_argument("--before", metavar="CHECKOUT", help="also run every streamed configuration under this checkout's code")
    ap.add_argument("--image-shard-mb", type=float, default=16.0, help="CIFAR-10's shard size in MiB (default 16)")
    ap.add_argument("--token-shard-mb", type=float, default=16.0, help="the corpus's shard size in MiB (default 16)")
    ap.add_argument("--no-resume", action="store_true", help="leave out the resume at step 100,000")
    args = ap.parse_args()
    import boto3
    from moto.server import ThreadedMotoServer

    from hasten.data.prepare import prepare
    tmp = Path(tempfile.mkdtemp(prefix="hasten-stream-rate-"))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server._server.server_port}"
    s3env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
             "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(s3env)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
    t0 = time.perf_counter()
    prepare(args.data, str(tmp / "cifar"), shard_mb=args.image_shard_mb)
    prepare(args.data, "s3://bench/cifar", shard_mb=args.image_shard_mb)
    prepare(args.corpus, str(tmp / "prose"), block_size=256, shard_mb=args.token_shard_mb)
    prepare(args.corpus, "s3://bench/prose", block_size=256, shard_mb=args.token_shard_mb)
    prepared_s = time.perf_counter() - t0
    total = args.warmup + args.steps
    cifar = ["cifar10-baseline", f"trainer.max_duration={total}ba", "trainer.eval_interval=100000ba"]
    gpt = ["prose-gpt-baseline", f"trainer.max_duration={total}ba", "trainer.eval_interval=100000ba",
           "data.block_size=256"]
    configs = [("cifar10", "in memory (device loader)", [*cifar, f"data.path={args.data}", "data.loader=device"])]
    for w in (0, 1, 2):
        configs.append(("cifar10", f"worker DataLoader, {w} workers",
                        [*cifar, f"data.path={args.data}", "data.loader=dataloader", f"data.num_workers={w}"]))
    for where, src in (("local folder", str(tmp / "cifar")), ("S3 (local server)", "s3://bench/cifar")):
        for w in (0, 1, 2):
            configs.append(("cifar10", f"streamed, {where}, {w} workers",
                            [*cifar, f"data.stream={src}", f"data.num_workers={w}",
                             f"data.stream_cache={tmp / 'cache'}"]))
    configs.append(("prose GPT", "in memory (random windows)", [*gpt, f"data.source={args.corpus}", "data.tokenizer=bpe"]))
    for where, src in (("local folder", str(tmp / "prose")), ("S3 (local server)", "s3://bench/prose")):
        for w in (0, 1, 2):
            configs.append(("prose GPT", f"streamed, {where}, {w} workers",
                            [*gpt, f"data.source={src}", "data.tokenizer=bpe", f"data.num_workers={w}",
                             f"data.stream_cache={tmp / 'cache'}"]))
    configs = [(t, label, a, {}) for t, label, a in configs]
    if args.before:
        src = str(Path(args.before).resolve() / "src")
        configs = [c for conf in configs for c in
                   ([conf, (conf[0], f"{conf[1]}, code before", conf[2], {"PYTHONPATH": src})]
                    if conf[1].startswith("streamed") else [conf])]
    if args.only:
        configs = [c for c in configs if any(o in c[0] or o in c[1] for o in args.only)]
    results = {i: [] for i in range(len(configs))}
    for r in range(args.rounds):
        order = list(range(len(configs)))
        if r % 2:
            order.reverse()
        for i in order:
            task, label, cargs, env = configs[i]
            got = run(cargs, {**s3env, **env}, tmp / f"run-{r}-{i}", args.warmup)
            results[i].append(got)
            print(f"round {r + 1} {task} {label}: {got['steps_per_s']:.3f} steps/s, data {got['data_wait']:.0%}",
                  flush=True)
    resume = {} if args.no_resume else {   # each alone: after every timed run
        where: resume_at(src, 100_000, s3env, tmp) for where, src in
        (("local folder", str(tmp / "prose")), ("S3 (local server)", "s3://bench/prose"))}
    server.stop()
    rows, data = [], {"configs": [], "resume": resume, "prepare_s": prepared_s, "rounds": args.rounds,
                      "steps": args.steps, "warmup": args.warmup,
                      "shard_mb": {"cifar10": args.image_shard_mb, "prose GPT": args.token_shard_mb}}
    base = {}
    for i, (task, label, cargs, env) in enumerate(configs):
        rs = results[i]
        rate = statistics.median(x["steps_per_s"] for x in rs)
        base.setdefault(task, rate)
        wait = statistics.median(x["data_wait"] for x in rs if x["data_wait"] is not None)
        peak, wpeak = max(x["peak_mb"] for x in rs), max(x["workers_peak_mb"] for x in rs)
        data["configs"].append({"task": task, "path": label, "args": cargs, "env": env, "runs": rs})
        rows.append(f"| {task} | {label} | {rate:.3f} ({min(x['steps_per_s'] for x in rs):.3f}-"
                    f"{max(x['steps_per_s'] for x in rs):.3f}) | {rate / base[task]:.2f} | {100 * wait:.0f}% | "
                    f"{peak:,.0f} | {wpeak:,.0f} |")
    twins = []
    for i, (task, label, _, env) in enumerate(configs):
        if env and label.endswith(", code before"):
            j = next(k for k, c in enumerate(configs) if c[0] == task and c[1] == label[:-len(", code before")])
            per_round = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(results[j], results[i])]
            twins.append((task, configs[j][1], statistics.median(per_round), min(per_round), max(per_round)))
    data["this_code_over_before"] = [{"task": t, "path": p, "median": m, "min": lo, "max": hi}
                                     for t, p, m, lo, hi in twins]
    codes = sorted({(x["code"] or {}).get("commit") or "?" for c in data["configs"] for x in c["runs"]})
    md = (f"# Step rate by data path\n\n`hasten train` of {args.warmup} warm-up and {args.steps} timed steps a run, "
          f"{args.rounds} rounds alternating, shards of {args.image_shard_mb:g} MiB (CIFAR-10) and "
          f"{args.token_shard_mb:g} MiB (prose); the median over rounds (range); against "
          f"the task's first path (in memory where it ran). Code the runs recorded: {', '.join(c[:10] for c in codes)}. "
          "Peak "
          "memory: the training process, and the largest loader worker (0 without workers). The S3 server (moto) runs "
          "on the loopback address in the benchmark's own process.\n\n"
          "| task | data path | steps/s (range) | vs in memory | waiting for data | peak MB | worker peak MB |\n"
          "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
          + ("This code's step rate over the code before, the same round's runs (median over rounds, range):\n\n"
             "| task | data path | this code / before |\n|---|---|---|\n"
             + "\n".join(f"| {t} | {p} | {m:.3f} ({lo:.3f}-{hi:.3f}) |" for t, p, m, lo, hi in twins) + "\n\n"
             if twins else "")
          + ("Resuming a streamed prose GPT at step 100,000 (a fresh process, alone on the machine after the timed "
             "runs: building the run, then the first batch at that position):\n\n| source | set-up s | first batch s | "
             "epoch, batch in epoch |\n|---|---|---|---|\n"
             + "\n".join(f"| {k} | {v['set_up_s']:.1f} | {v['first_batch_s']:.2f} | {v['epoch']}, {v['batch_in_epoch']} |"
                         for k, v in resume.items()) + "\n" if resume else ""))
    write_results(args.name, data, md, "systems")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
