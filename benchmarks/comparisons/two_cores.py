"""How best to use a CPU's cores for the CIFAR speedrun: one process with every core as
intra-op threads, or one process per core (data parallel).

`cifar10-fast` runs one process whose convolutions spread over every core (oneDNN's intra-op
threads). The alternative is data parallelism over processes, one thread each, half the
global batch each. This measures the speedrun network's training step (widths 64/256/256,
bf16 autocast where the CPU has bf16 hardware, fp32 elsewhere, channels-last, hasten's host
allocator settings, an SGD update) at the recipe's image sizes and global batch, three ways:

- `threads`: one process, every core as intra-op threads, the whole batch;
- `processes`: one process per core, one thread each, an equal share of the batch, no
  communication: the most that data parallelism over processes could give;
- `ddp`: the same processes under DistributedDataParallel (gloo), gradients averaged every
  step: what it gives.

Each way runs in fresh processes, alternating over rounds (A B C, then C B A), with warm-up
steps excluded; the processes of one measurement start timing together (a gloo barrier) and
the measurement ends when the last one is done. Throughput is the global batch over the
median step time; the ratio is against `threads`.

    python -m benchmarks.comparisons.two_cores --name two_cores-epyc-bf16
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path


WAYS = ("threads", "processes", "ddp")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(args) -> None:
    """One process of one measurement: prints its seconds per step as JSON."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from hasten.allocator import tune_host_allocator
    from hasten.hardware import cpu_has_bf16
    from hasten.models.speedrun import SpeedrunNet

    tune_host_allocator()
    torch.set_num_threads(args.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = SpeedrunNet(widths=[64, 256, 256]).to(memory_format=torch.channels_last)
    if args.way == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    batch = args.batch // world
    x = torch.randn(batch, 3, args.size, args.size).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    bf16 = cpu_has_bf16()

    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y, label_smoothing=0.2)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        if world > 1:
            dist.barrier()   # every process starts the step together; the step ends with the slowest
        t0 = time.perf_counter()
        step()
        if world > 1:
            dist.barrier()
        times.append(time.perf_counter() - t0)
    if world > 1:
        dist.destroy_process_group()
    print(json.dumps({"step_s": times}))


def measure(way: str, size: int, batch: int, steps: int, warmup: int, cores: int) -> float:
    """The median seconds per global step of one way, in fresh processes."""
    procs = 1 if way == "threads" else cores
    threads = cores if way == "threads" else 1
    port = free_port()
    cmd = [sys.executable, "-m", __spec__.name, "--worker", way, "--size", str(size), "--batch", str(batch),
           "--steps", str(steps), "--warmup", str(warmup), "--threads", str(threads)]
    runs = []
    for rank in range(procs):
        env = {**os.environ, "WORLD_SIZE": str(procs), "RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(threads)}
        runs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=1800)[0] for p in runs]
    if any(p.returncode for p in runs):
        raise SystemExit(f"two_cores: the {way} measurement at {size} px failed (exit codes "
                         f"{[p.returncode for p in runs]})")
    per_proc = [json.loads(o.strip().splitlines()[-1])["step_s"] for o in outs]
    # a step of the measurement lasts as long as its slowest process (the barriers make them equal)
    return statistics.median(max(ts) for ts in zip(*per_proc))


def render(data: dict) -> str:
    out = [f"# One process with {data['cores']} threads, or {data['cores']} processes of one thread",
           "",
           f"The speedrun network's training step, global batch {data['batch']}, {data['precision']}, channels-last, "
           f"hasten's host allocator settings; median seconds per step over {data['rounds']} rounds of {data['steps']} "
           f"steps each (warm-up excluded), the ways alternating. Images a second, and the ratio to one process "
           f"with every core as threads:",
           "",
           "| image size | threads | processes, no communication | DDP (gloo) |",
           "|---|---|---|---|"]
    for size, row in data["sizes"].items():
        base = data["batch"] / row["threads"]
        cells = []
        for way in WAYS:
            rate = data["batch"] / row[way]
            cells.append(f"{rate:.0f}" + ("" if way == "threads" else f" ({rate / base:.3f}x)"))
        out.append(f"| {size} px | " + " | ".join(cells) + " |")
    out += ["", "`processes` is the most that data parallelism over processes could give: it has no gradient "
                "exchange. Each process's batch-norm statistics then come from its share of the batch."]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=2000, help="the global batch (default: the recipe's, 2000)")
    ap.add_argument("--sizes", default="24,28,32", help="image sizes, comma-separated (default: the recipe's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--name", default="two_cores")
    ap.add_argument("--worker", choices=WAYS, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=32, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        args.way = args.worker
        worker(args)
        return 0
    cores = os.cpu_count() or 1
    if cores < 2:
        ap.error("this machine has one core: there is nothing to split")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes takes whole numbers separated by commas, not {args.sizes!r}")
    if args.batch % cores or min(args.rounds, args.steps, args.batch, *sizes) < 1 or args.warmup < 0:
        ap.error(f"--batch must divide by the {cores} cores; --rounds, --steps and sizes must be at least 1")

    from benchmarks.tools.common import write_results

    from hasten.hardware import cpu_has_bf16

    data = {"batch": args.batch, "cores": cores, "rounds": args.rounds, "steps": args.steps,
            "precision": "bf16" if cpu_has_bf16() else "fp32", "sizes": {}, "per_round": {}}
    for size in sizes:
        got = {w: [] for w in WAYS}
        for r in range(args.rounds):
            for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                got[way].append(measure(way, size, args.batch, args.steps, args.warmup, cores))
                print(f"{size} px, round {r + 1}, {way}: {got[way][-1]:.3f} s a step", flush=True)
        data["per_round"][str(size)] = got
        data["sizes"][str(size)] = {w: statistics.median(v) for w, v in got.items()}
    j, m = write_results(args.name, data, render(data))
    print(m.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
