"""Data-parallel training on CPU with gloo, two processes: the same run as one process with
the same global batch (losses, weights, evaluation), every sample evaluated once."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

JOB = Path(__file__).parent / "helpers" / "ddp_job.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp_path, model: str, world: int, grad_accum: int = 1, extra: tuple = (), job_env=None,
            expect_killed: bool = False, tag: str = "") -> dict | None:
    out = tmp_path / f"{model}-{world}-{grad_accum}{tag}.pt"
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


def test_every_packaged_algorithm_runs_under_ddp_or_is_refused_with_a_reason(tmp_path):
    import json
    sys.path.insert(0, str(JOB.parent))
    import ddp_algorithms
    from hasten.algorithms import REGISTRY
    covered = {n.split("+")[0] for n in {**ddp_algorithms.VISION, **ddp_algorithms.LM}}
    assert covered == set(REGISTRY), f"not exercised under DDP: {set(REGISTRY) - covered}"
    out = tmp_path / "algos.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    port = _port()
    procs = [subprocess.Popen([sys.executable, str(JOB.parent / "ddp_algorithms.py"), str(out)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    results = json.loads(out.read_text())
    refused = {n for n, v in results.items() if v.startswith("refused: ")}
    assert refused == {"infobatch", "layer_freezing", "patch_whitening+train_bias_for"}, results
    assert all(v == "ok" for n, v in results.items() if n not in refused), results   # and the ranks agree


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


def test_bench_runs_each_run_data_parallel_with_nproc(tmp_path):
    import json

    from hasten.cli import main
    tiny = Path(__file__).parent / "helpers" / "tiny_lm.yaml"
    assert main(["bench", str(tiny), "trainer.max_duration=10ba", "--nproc", "2", "--target", "val/loss<=@first-worst",
                 "--seeds", "1", "--out", str(tmp_path), "--name", "b"]) == 0
    (run,) = [json.loads(ln) for ln in (tmp_path / "b" / "runs.jsonl").read_text().splitlines()]
    assert run["status"] == "finished" and run["final"]["world_size"] == 2 and run["final"]["batch"] == 10


def test_nproc_refuses_an_algorithm_ddp_cannot_run_before_any_process_starts(tmp_path, capsys):
    from hasten.cli import main
    tiny = Path(__file__).parent / "helpers" / "tiny_lm.yaml"
    run = tmp_path / "run"
    assert main(["train", str(tiny), "algorithms.infobatch={}", f"trainer.run_dir={run}", "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot train data-parallel with InfoBatch" in err
    assert not run.exists()
