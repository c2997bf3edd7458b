"""Data-parallel training on CPU with gloo, two processes: the same run as one process with
the same global batch (losses, weights, evaluation), every sample evaluated once."""
import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

JOB = Path(__file__).parent / "helpers" / "ddp_job.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


UNPOOLED = ("JOB_KILL_AT", "JOB_KILL_IN_SAVE", "JOB_TRAP")   # jobs that end or patch their process for good


class _Pool:
    """One process (world 1) or a pair joined in a process group (world 2) running ddp_job
    jobs one after another (helpers/ddp_pool.py): Python, torch and the group start once."""

    def __init__(self, world: int):
        self.world, self.procs, self.n = world, None, 0

    def _start(self) -> None:
        self.control = Path(tempfile.mkdtemp(prefix="hasten-ddp-pool-"))
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        env["PYTHONPATH"] = os.pathsep.join([str(JOB.parent)] + ([env["PYTHONPATH"]] if "PYTHONPATH" in env else []))
        port, self.procs, self.logs, self.n = _port(), [], [], 0
        for rank in range(self.world):
            e = dict(env)
            if self.world > 1:
                e.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(self.world), MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=str(port))
            log = open(self.control / f"rank{rank}.log", "w")
            self.logs.append(log)
            self.procs.append(subprocess.Popen([sys.executable, str(JOB.parent / "ddp_pool.py"), str(self.control)],
                                               env=e, stdout=log, stderr=subprocess.STDOUT))

    def run(self, args: list, env: dict, timeout: float = 180) -> str | None:
        """Run one job on every rank; None when all say ok, else what went wrong (the pool is
        then closed, and the next job starts a fresh one)."""
        if self.procs is None or any(p.poll() is not None for p in self.procs):
            self._start()
        n = self.n
        self.n += 1
        tmp = self.control / f"job{n}.json.tmp"
        tmp.write_text(json.dumps({"args": [str(a) for a in args], "env": env}))
        os.replace(tmp, self.control / f"job{n}.json")
        done = [self.control / f"done{n}.rank{r}" for r in range(self.world)]
        deadline = time.time() + timeout
        while not all(d.exists() for d in done):
            if time.time() > deadline or any(p.poll() is not None for p in self.procs):
                return self._fail(f"job {n} {args} did not finish")
            time.sleep(0.01)
        bad = [d.read_text() for d in done if d.read_text() != "ok"]
        return self._fail("\n".join(bad)) if bad else None

    def _fail(self, what: str) -> str:
        logs = "\n".join((self.control / f"rank{r}.log").read_text()[-3000:] for r in range(self.world))
        self.close(kill=True)
        return f"{what}\n{logs}"

    def close(self, kill: bool = False) -> None:
        if self.procs is None:
            return
        if not kill:
            (self.control / f"job{self.n}.json").write_text(json.dumps({"stop": True}))
        for p in self.procs:
            try:
                p.wait(timeout=0 if kill else 20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if kill and p.poll() is None:
                p.kill()
                p.wait()
        for log in self.logs:
            log.close()
        self.procs = None


_POOLS = {w: _Pool(w) for w in (1, 2)}
atexit.register(lambda: [pool.close() for pool in _POOLS.values()])


def _launch(tmp_path, model: str, world: int, grad_accum: int = 1, extra: tuple = (), job_env=None,
            expect_killed: bool = False, tag: str = "") -> dict | None:
    out = tmp_path / f"{model}-{world}-{grad_accum}{tag}.pt"
    pooled = (not expect_killed and not any(k in (job_env or {}) for k in UNPOOLED)
              and (not extra or extra[0] == "0") and world in _POOLS)
    if pooled:   # the same job, in processes that stay up between tests
        problem = _POOLS[world].run([model, out, grad_accum, *extra], dict(job_env or {}))
        assert problem is None, problem
        return torch.load(out, weights_only=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(job_env or {})
    env["PYTHONPATH"] = os.pathsep.join([str(JOB.parent)] + ([env["PYTHONPATH"]] if "PYTHONPATH" in env else []))
    procs = []
    port = _port()
    for rank in range(world):
        e = dict(env)
        if world > 1:
            e.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, str(JOB), model, str(out), str(grad_accum), *extra], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=180)[0] for p in procs]
    if expect_killed:
        assert all(p.returncode == -9 for p in procs), "\n".join(logs)
        return None
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return torch.load(out, weights_only=True)


@pytest.mark.parametrize("model,grad_accum", [("mlp", 2), ("gpt", 1)])   # mlp: unequal shares (3 and 2)
def test_two_processes_equal_one_with_the_same_global_batch(tmp_path, model, grad_accum):
    one = _launch(tmp_path, model, 1, grad_accum)
    two = _launch(tmp_path, model, 2, grad_accum)
    assert two["world"] == 2 and one["world"] == 1
    assert two["samples"] == one["samples"]                   # the clock counts the global batch
    for k, w in one["weights"].items():                        # float summation order differs: 1e-5
        torch.testing.assert_close(two["weights"][k], w, rtol=1e-5, atol=1e-6)
    l1 = [r["train/loss"] for r in one["logged"] if "train/loss" in r]
    l2 = [r["train/loss"] for r in two["logged"] if "train/loss" in r]
    assert len(l1) == len(l2) == 4 and l1 == pytest.approx(l2, rel=1e-5)
    # evaluation: 33 samples (mlp) split unevenly over two ranks, each counted once
    assert two["eval"]["val/loss"] == pytest.approx(one["eval"]["val/loss"], rel=1e-6)
    if "val/acc" in one["eval"]:
        assert two["eval"]["val/acc"] == one["eval"]["val/acc"]


@pytest.mark.parametrize("model", ["gpt-b1", "gpt-masked"])
def test_an_empty_share_and_ignored_targets_train_as_one_process(tmp_path, model):
    """A global batch smaller than the world (one window, two ranks: the second's share is
    empty) trains, logs, evaluates and ends as one process does, every collective joined; and
    targets that are mostly the ignore index are counted over all ranks (the loss is the mean
    over the targets that count, whichever rank holds them)."""
    one = _launch(tmp_path, model, 1)
    two = _launch(tmp_path, model, 2)
    _same_weights(one, two)
    l1 = [r["train/loss"] for r in one["logged"] if "train/loss" in r]
    l2 = [r["train/loss"] for r in two["logged"] if "train/loss" in r]
    assert len(l1) == len(l2) == 4 and l1 == pytest.approx(l2, rel=1e-5)
    assert two["eval"]["val/loss"] == pytest.approx(one["eval"]["val/loss"], rel=1e-6)


def _rank_records(tmp_path, model, world, grad_accum=1, tag=""):
    import json
    return [json.loads((tmp_path / f"{model}-{world}-{grad_accum}{tag}.pt.rank{r}.json").read_text()) for r in range(world)]


def _same_weights(a, b):
    for k, w in a["weights"].items():                          # float summation order differs: 1e-5
        torch.testing.assert_close(b["weights"][k], w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model,loader,grad_accum", [("mlp", "hasten", 2), ("conv-device", "device", 1)])
def test_hasten_loaders_load_only_their_share_and_equal_one_process(tmp_path, model, loader, grad_accum):
    """make_dataloader (its batch sampler yields each rank's share of a global batch of 9) and a
    DeviceLoader that translates, flips and cuts out (random numbers drawn for the whole global
    batch, each rank gathering and augmenting its share): two processes train as one."""
    env = {"JOB_LOADER": loader}
    one = _launch(tmp_path, model, 1, grad_accum, job_env=env)
    two = _launch(tmp_path, model, 2, grad_accum, job_env=env)
    assert two["samples"] == one["samples"] == {"mlp": 96 + 9, "conv-device": 43 + 43 + 18}[model]   # last batches of 6 and 7
    _same_weights(one, two)
    assert two["eval"]["val/loss"] == pytest.approx(one["eval"]["val/loss"], rel=1e-6)


def test_a_loader_over_a_distributed_sampler_is_taken_as_this_ranks_share(tmp_path):
    """A user's DataLoader over DistributedSampler (48 samples a rank, per-rank batch 5): used as
    it is, the clock counting the global batch (an epoch of 10 batches: 9 x 10 + 2 x 3 samples,
    then 2 batches of 10)."""
    two = _launch(tmp_path, "mlp", 2, job_env={"JOB_LOADER": "distsampler"})
    assert two["samples"] == 96 + 20 and all(r["sample"] == 116 for r in _rank_records(tmp_path, "mlp", 2))


def test_an_evaluation_loader_over_a_distributed_sampler_is_refused():
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    from hasten.data import sharding
    data = TensorDataset(torch.zeros(5, 2))
    loader = DataLoader(data, sampler=DistributedSampler(data, num_replicas=2, rank=0))
    assert sharding.prepare(loader, 0, 2).mode == "sampler"
    with pytest.raises(ValueError, match="counted twice: give the evaluation loader unsharded"):
        sharding.prepare(loader, 0, 2, "evaluation")


def test_infobatch_under_ddp_prunes_the_same_samples_on_every_rank_as_one_process(tmp_path):
    """Through the Trainer, 4 epochs on make_dataloader with global batch 9 and accumulation 2:
    each rank records every epoch's plan; both ranks plan the samples the one-process run
    plans, and end with its weights. With every step's host reads trapped (no host sync)."""
    env = {"JOB_ALGO": "infobatch", "JOB_LOADER": "hasten", "JOB_TRAP": "1"}
    one = _launch(tmp_path, "mlp", 1, 2, job_env=env)
    two = _launch(tmp_path, "mlp", 2, 2, job_env=env)
    (solo,), ranks = _rank_records(tmp_path, "mlp", 1, 2), _rank_records(tmp_path, "mlp", 2, 2)
    assert len(solo["kept"]) == 4 and len(solo["kept"][1]) < 96            # pruning happened from epoch 1
    assert ranks[0]["kept"] == ranks[1]["kept"] == solo["kept"]
    assert ranks[0]["sample"] == solo["sample"] == sum(len(k) for k in solo["kept"])
    assert all(r["trapped_steps"] == r["batch"] for r in ranks + [solo])  # every step ran under the trap
    _same_weights(one, two)


def test_layer_freezing_under_ddp_equals_one_process(tmp_path):
    """Freezing part-way through a data-parallel run (DDP built with find_unused_parameters):
    the frozen tensors get no gradient and no momentum step, as in one process."""
    env = {"JOB_ALGO": "layer_freezing"}
    one = _launch(tmp_path, "mlp", 1, job_env=env)
    two = _launch(tmp_path, "mlp", 2, job_env=env)
    _same_weights(one, two)


def _algorithms_under(tmp_path, parallel: str) -> dict:
    import json
    sys.path.insert(0, str(JOB.parent))
    import ddp_algorithms
    from hasten.algorithms import REGISTRY
    covered = {n.split("+")[0] for n in {**ddp_algorithms.VISION, **ddp_algorithms.LM}}
    assert covered == set(REGISTRY), f"not exercised under {parallel}: {set(REGISTRY) - covered}"
    out = tmp_path / f"algos-{parallel}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    port = _port()
    procs = [subprocess.Popen([sys.executable, str(JOB.parent / "ddp_algorithms.py"), str(out)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "JOB_PARALLEL": parallel,
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        logs = [p.communicate(timeout=300)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:   # never leave a rank behind; show where each one was
            p.kill()
        logs = [p.communicate()[0] for p in procs]
        pytest.fail("a rank hung:\n" + "\n".join(f"--- rank {r}\n{log}" for r, log in enumerate(logs)))
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return json.loads(out.read_text())


def test_every_packaged_algorithm_runs_under_ddp_or_is_refused_with_a_reason(tmp_path):
    results = _algorithms_under(tmp_path, "ddp")
    flags = {k.split(":")[0]: results.pop(k) for k in [k for k in results if k.endswith(":find_unused")]}
    # none is refused today: InfoBatch shares its scores across ranks; layer_freezing, which
    # freezes parameters a few at a time, gets DDP's find_unused_parameters; patch whitening's
    # bias, frozen once, gets a new wrapper without it (no graph walk per step after that)
    assert all(v == "ok" for v in results.values()), {n: v for n, v in results.items() if v != "ok"}   # ranks agree
    assert flags["patch_whitening+train_bias_for"] is False and flags["layer_freezing"] is True, flags


def test_every_packaged_algorithm_runs_under_fsdp_or_is_refused_with_a_reason(tmp_path):
    """EMA, SWA and lookahead keep sharded copies; three are refused at start, each with its reason."""
    results = _algorithms_under(tmp_path, "fsdp")
    refused = {n for n, v in results.items() if v.startswith("refused: ")}
    assert refused == {"channels_last", "chunked_cross_entropy", "gradual_pruning"}, results
    assert all(v == "ok" for n, v in results.items() if n not in refused), \
        {n: v for n, v in results.items() if n not in refused and v != "ok"}   # and the ranks agree


def test_per_rank_batch_norm_is_ghost_batch_norm_of_the_per_rank_batch(tmp_path):
    """Two processes at global batch 8 normalise each share of 4 on its own: the same training
    as one process with ghost batch norm of 4 (weights; running statistics differ, DDP keeps
    rank 0's)."""
    ghost = _launch(tmp_path, "convbn-ghost4", 1)
    two = _launch(tmp_path, "convbn", 2)
    plain = _launch(tmp_path, "convbn", 1)
    for k, w in ghost["weights"].items():
        if "running" in k or "num_batches" in k:
            continue
        torch.testing.assert_close(two["weights"][k.replace(".bn.", ".")], w, rtol=1e-5, atol=1e-6)   # ghost BN wraps the BN
    assert not torch.allclose(plain["weights"]["0.weight"], two["weights"]["0.weight"], rtol=1e-5, atol=1e-6)


def test_sync_batchnorm_on_the_cpu_is_refused_with_the_reason():
    from hasten import Trainer
    from hasten.runtime import Runtime, World
    rt = Runtime(torch.device("cpu"), "fp32", 0, 1, "default", world=World(parallelism="ddp"))
    with pytest.raises(ValueError, match="sync_batchnorm needs CUDA.*ghost batch norm"):
        Trainer(torch.nn.Sequential(torch.nn.Linear(2, 2)), [], runtime=rt, sync_batchnorm=True)


def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step_with_one_checkpoint(tmp_path):
    import json
    save = tmp_path / "ckpt"
    _launch(tmp_path, "mlp", 2, 1, ("5", str(save)))
    ranks = [json.loads((tmp_path / f"mlp-2-1.pt.rank{r}.json").read_text()) for r in range(2)]
    # rank 1 saw SIGTERM at batch 5; the ranks' vote of batch 5 is read at the end of batch 6
    assert [r["batch"] for r in ranks] == [6, 6] and all(r["stop_reason"] == "sigterm" for r in ranks)
    assert ranks[0]["last_checkpoint"] and Path(ranks[0]["last_checkpoint"]).name == "ep0-ba6.pt"
    assert sorted(p.name for p in save.iterdir() if p.suffix == ".pt") == ["ep0-ba6.pt"]


def test_a_rank_that_dies_stops_the_other_with_an_error_naming_it():
    import time
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    port = _port()
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, str(JOB.parent / "ddp_die.py")],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    out0 = procs[0].communicate(timeout=120)[0]
    procs[1].communicate(timeout=30)
    assert procs[1].returncode == -9
    assert procs[0].returncode == 1 and "rank 1 of the run is gone" in out0, out0
    assert time.monotonic() - t0 < 60   # within the collective timeout (30 s), not a hang



def test_lost_ranks_sees_a_peer_that_is_still_exiting_when_the_collective_fails(monkeypatch):
    """A killed process closes its sockets before it is gone, so the failed collective can be
    seen while the peer still runs: lost_ranks must look again for a moment, not answer 'none'."""
    import torch.distributed as dist
    from hasten.distributed.stop import StopCoordinator
    from hasten.distributed.world import World
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    atexit.register(peer.kill)

    class Store:
        def get(self, key):
            assert key == "hasten/rank1"
            return f"{socket.gethostname()} {peer.pid}".encode()

    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: Store())
    stop = StopCoordinator(World(rank=0, size=1))
    stop.world = World(rank=0, size=2)   # built as one process (no vote group), asked as rank 0 of two
    t0 = time.monotonic()
    assert stop.lost_ranks() == [1]   # still running when asked, gone (a zombie) within the grace
    assert 0.2 < time.monotonic() - t0 < 5
    peer.wait()

def test_a_killed_two_process_run_resumes_under_two_and_under_one(tmp_path):
    """Killed with SIGKILL after batch 7 (checkpoint at batch 4): resumed with two processes
    it ends as the uninterrupted run; with one process, as the uninterrupted run to 1e-5."""
    whole = _launch(tmp_path, "mlp", 2, tag="-whole")
    for resume_world in (2, 1):
        save = tmp_path / f"ckpt-{resume_world}"
        job = {"JOB_SAVE_EVERY": "4ba"}
        _launch(tmp_path, "mlp", 2, extra=("0", str(save)), job_env={**job, "JOB_KILL_AT": "7"}, expect_killed=True,
                tag=f"-killed{resume_world}")
        assert sorted(p.name for p in save.iterdir() if p.suffix == ".pt") == ["ep0-ba4.pt"]
        resumed = _launch(tmp_path, "mlp", resume_world, extra=("0", str(save)), job_env={**job, "JOB_RESUME": "1"},
                          tag=f"-resumed{resume_world}")
        for k, w in whole["weights"].items():
            torch.testing.assert_close(resumed["weights"][k], w, rtol=1e-5, atol=1e-6)
        assert resumed["eval"]["val/acc"] == whole["eval"]["val/acc"]


def test_bench_runs_each_run_data_parallel_with_nproc_and_compares_world_sizes(tmp_path):
    """--nproc 1,2: every recipe at each world size, side by side in one report."""
    import json

    from hasten.cli import main
    tiny = Path(__file__).parent / "helpers" / "tiny_lm.yaml"
    assert main(["bench", str(tiny), "trainer.max_duration=10ba", "--nproc", "1,2", "--target", "val/loss<=@first-worst",
                 "--seeds", "1", "--out", str(tmp_path), "--name", "b"]) == 0
    runs = [json.loads(ln) for ln in (tmp_path / "b" / "runs.jsonl").read_text().splitlines()]
    assert [(r["label"], r["final"]["world_size"]) for r in runs] == [("tiny_lm x1proc", 1), ("tiny_lm x2proc", 2)]
    assert all(r["status"] == "finished" and r["final"]["batch"] == 10 for r in runs)
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert set(report["recipes"]) == {"tiny_lm x1proc", "tiny_lm x2proc"}
    with pytest.raises(SystemExit) as bad:   # argparse's one-line usage error
        main(["bench", str(tiny), "--nproc", "0", "--target", "val/loss<=1", "--out", str(tmp_path)])
    assert bad.value.code == 2


def test_nproc_refuses_an_algorithm_ddp_cannot_run_before_any_process_starts(tmp_path, capsys, monkeypatch):
    from hasten.algorithms.delay import Delay
    from hasten.cli import main
    monkeypatch.setattr(Delay, "ddp_refusal", lambda self: "it cannot (a test's stand-in)")   # no packaged one refuses
    tiny = Path(__file__).parent / "helpers" / "tiny_lm.yaml"
    run = tmp_path / "run"
    assert main(["train", str(tiny), "algorithms.delay={}", f"trainer.run_dir={run}", "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot train data-parallel with Delay: it cannot" in err
    assert not run.exists()


# ---------------------------------------------------------------------------- FSDP (sharded)
@pytest.mark.parametrize("model,grad_accum,reshard,ac", [("mlp", 2, "1", "0"), ("mlp", 1, "0", "0"), ("gpt", 1, "1", "1"),
                                                       ("gpt", 1, "0", "0")])
def test_fsdp_equals_one_process_in_both_resharding_styles(tmp_path, model, grad_accum, reshard, ac):
    """FSDP2 over two processes (ZeRO-3: reshard after forward; ZeRO-2 style: keep the gathered
    parameters for the backward; the GPT sharded per transformer block, once with activation
    checkpointing) trains the weights one unsharded process trains, to 1e-5, and evaluates the same."""
    one = _launch(tmp_path, model, 1, grad_accum)
    two = _launch(tmp_path, model, 2, grad_accum, job_env={"JOB_PARALLEL": "fsdp", "JOB_RESHARD": reshard, "JOB_AC": ac},
                  tag="-fsdp")
    assert two["samples"] == one["samples"]
    _same_weights(one, two)
    assert two["eval"]["val/loss"] == pytest.approx(one["eval"]["val/loss"], rel=1e-6)


def test_fsdp_with_the_bf16_policy_stays_near_one_process_in_bf16(tmp_path):
    """bf16-mixed: FSDP gathers the parameters in bf16 and reduces gradients in fp32; one
    process runs the same model under bf16 autocast. Roundings differ, so the tolerance is
    looser: weights within 2e-2 absolute after 12 steps (they are of order 0.1), evaluation
    loss within 1%."""
    env = {"JOB_PRECISION": "bf16-mixed"}
    one = _launch(tmp_path, "gpt", 1, job_env=env)
    two = _launch(tmp_path, "gpt", 2, job_env={**env, "JOB_PARALLEL": "fsdp"}, tag="-fsdp")
    for k, w in one["weights"].items():
        torch.testing.assert_close(two["weights"][k].float(), w.float(), rtol=0, atol=2e-2)
    assert two["eval"]["val/loss"] == pytest.approx(one["eval"]["val/loss"], rel=1e-2)


@pytest.mark.parametrize("kind", ["sharded", "whole"])
def test_a_killed_fsdp_run_resumes_under_two_and_under_one_and_its_checkpoint_loads_unsharded(tmp_path, kind):
    """A sharded two-process run killed by SIGKILL after batch 7 (checkpoint at batch 4) resumes
    sharded under two processes and under one (and a one-process sharded run under two, from a
    .dcp checkpoint) and ends as the uninterrupted sharded run, with
    EMA, whose sharded average is saved and sharded again on resume (its final swap puts the
    average in the weights compared). Checkpoints: 'sharded', a .dcp folder of every rank's
    shards (torch.distributed.checkpoint), resharded on load; 'whole', one file gathered by rank
    0. Either exports to (or is) a single file that loads with weights_only=True into a plain,
    unsharded model giving the same outputs."""
    fsdp = {"JOB_PARALLEL": "fsdp", "JOB_ALGO": "ema", "JOB_CKPT": kind}
    suffix = ".dcp" if kind == "sharded" else ".pt"
    whole_dir = tmp_path / "ckpt-whole"
    whole = _launch(tmp_path, "mlp", 2, extra=("0", str(whole_dir)), job_env=fsdp, tag="-whole")
    moves = ((2, 2), (2, 1), (1, 2)) if kind == "sharded" else ((2, 2), (2, 1))   # (killed world, resumed world)
    for killed_world, resume_world in moves:
        save = tmp_path / f"ckpt-{killed_world}-{resume_world}"
        job = {**fsdp, "JOB_SAVE_EVERY": "4ba"}
        _launch(tmp_path, "mlp", killed_world, extra=("0", str(save)), job_env={**job, "JOB_KILL_AT": "7"},
                expect_killed=True, tag=f"-killed{killed_world}{resume_world}")
        assert sorted(p.name for p in save.iterdir() if p.suffix == suffix) == [f"ep0-ba4{suffix}"]
        resumed = _launch(tmp_path, "mlp", resume_world, extra=("0", str(save)), job_env={**job, "JOB_RESUME": "1"},
                          tag=f"-resumed{killed_world}{resume_world}")
        _same_weights(whole, resumed)
        assert resumed["eval"]["val/acc"] == whole["eval"]["val/acc"]
    final = whole_dir / f"ep1-ba12{suffix}"
    if kind == "sharded":
        from hasten.checkpoint.sharded import export_whole
        final = Path(export_whole(final, tmp_path / "exported.pt"))
    payload = torch.load(final, map_location="cpu", weights_only=True)
    plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    plain.load_state_dict(payload["model"])
    x = torch.randn(5, 8)
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    reference.load_state_dict(whole["weights"])
    torch.testing.assert_close(plain(x), reference(x), rtol=0, atol=0)


def test_a_kill_during_a_sharded_save_leaves_the_previous_checkpoint_intact_and_loadable(tmp_path):
    """Both ranks SIGKILLed inside the save at batch 8, after writing their shards but before the
    folder gets its name: ep0-ba4.dcp is as it was, the partial folder is only a temporary, and
    a resumed run loads batch 4, clears the temporary and ends as the uninterrupted run."""
    env = {"JOB_PARALLEL": "fsdp", "JOB_SAVE_EVERY": "4ba"}
    whole = _launch(tmp_path, "mlp", 2, extra=("0", str(tmp_path / "whole")), job_env=env, tag="-whole")
    save = tmp_path / "ckpt"
    _launch(tmp_path, "mlp", 2, extra=("0", str(save)), job_env={**env, "JOB_KILL_IN_SAVE": "8"}, expect_killed=True,
            tag="-killed")
    names = sorted(p.name for p in save.iterdir() if "ep0-ba" in p.name)
    assert names == [".ep0-ba8.dcp.partial.tmp", "ep0-ba4.dcp"], names
    from hasten.checkpoint import CheckpointIO, find_latest
    assert find_latest(save).name == "ep0-ba4.dcp" and CheckpointIO().load(save / "ep0-ba4.dcp")["sharded"]
    resumed = _launch(tmp_path, "mlp", 2, extra=("0", str(save)), job_env={**env, "JOB_RESUME": "1"}, tag="-resumed")
    assert not (save / ".ep0-ba8.dcp.partial.tmp").exists()
    _same_weights(whole, resumed)


def test_swa_under_fsdp_keeps_a_sharded_average_and_ends_as_one_process(tmp_path):
    """SWA averages with torch's multi-tensor SWA function on each rank's shards: two sharded
    processes end with the average one process ends with (and evaluate it)."""
    one = _launch(tmp_path, "mlp", 1, job_env={"JOB_ALGO": "swa"})
    two = _launch(tmp_path, "mlp", 2, job_env={"JOB_ALGO": "swa", "JOB_PARALLEL": "fsdp"}, tag="-fsdp")
    _same_weights(one, two)
    assert two["eval"]["val/loss"] == pytest.approx(one["eval"]["val/loss"], rel=1e-6)


def test_muon_under_fsdp_orthogonalises_whole_matrices_as_one_process_does(tmp_path):
    """Muon's Newton-Schulz iteration needs each whole matrix: under FSDP hasten's Muon gathers
    each sharded update, orthogonalises it and keeps its shard, so two sharded processes train
    the GPT as one process does (orthogonalising each rank's half alone would not)."""
    env = {"JOB_OPT": "muon"}
    one = _launch(tmp_path, "gpt", 1, job_env=env)
    two = _launch(tmp_path, "gpt", 2, job_env={**env, "JOB_PARALLEL": "fsdp"}, tag="-fsdp")
    for k, w in one["weights"].items():   # the iteration amplifies summation-order differences: 2e-5
        torch.testing.assert_close(two["weights"][k], w, rtol=1e-4, atol=2e-5)


@pytest.mark.slow
def test_compiled_optimizer_steps_under_ddp_equal_one_eager_process(tmp_path):
    """trainer.compile_optimizer under DDP (gloo, two processes): the compiled Muon and AdamW steps,
    their learning rates held as tensors, train the GPT as one process stepping eagerly does."""
    one = _launch(tmp_path, "gpt", 1, job_env={"JOB_OPT": "muon"})
    two = _launch(tmp_path, "gpt", 2, job_env={"JOB_OPT": "muon", "JOB_COMPILE_OPT": "1"}, tag="-compiled")
    late = [r["compile/graphs_after_warmup"] for r in two["logged"] if "compile/graphs_after_warmup" in r]
    assert late == [0]   # compiled in the first step, nothing after
    for k, w in one["weights"].items():
        torch.testing.assert_close(two["weights"][k], w, rtol=1e-4, atol=2e-5)


def test_microbatch_auto_two_processes_agree_on_the_size_and_equal_one_process(tmp_path):
    from torch import nn

    from hasten.microbatch import ActivationBudget
    # global batch 10, shares of 5 per rank: the limit admits 2 samples a micro-batch, not 3 (nor 5)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).train()

    def saved(n):
        with ActivationBudget(10**12) as b:
            nn.functional.cross_entropy(model(torch.randn(n, 8)), torch.randint(0, 4, (n,)))
        return b.used
    limit = str((saved(2) + saved(3)) // 2)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    two_auto = _launch(tmp_path / "a", "mlp", 2, 1, job_env={"JOB_MICROBATCH": "auto", "JOB_MEMORY_LIMIT": limit})
    one_fixed = _launch(tmp_path / "b", "mlp", 1, 1, job_env={"JOB_MICROBATCH": "2"})
    for k, w in one_fixed["weights"].items():
        torch.testing.assert_close(two_auto["weights"][k], w, rtol=1e-5, atol=1e-6)
