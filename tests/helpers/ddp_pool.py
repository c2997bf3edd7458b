"""A pool worker for the data-parallel tests: joins the process group once and then runs
ddp_job.main for every job the test process hands it, in order, so the tests pay for
starting Python, importing torch and joining the group once instead of once per case.

    python ddp_pool.py CONTROL_DIR      (alone, or as each of N processes with torchrun's environment)

The test process writes CONTROL_DIR/jobN.json ({"args": [...], "env": {...}} or {"stop": true});
every rank runs job N with that environment (its JOB_* variables replacing the last job's)
and writes CONTROL_DIR/doneN.rankR ("ok", or the traceback). Jobs that kill their process or
patch it for good (JOB_KILL_AT, JOB_KILL_IN_SAVE, JOB_TRAP) are launched on their own instead."""
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
import ddp_job  # noqa: E402

from hasten import make_runtime  # noqa: E402


def main(control: Path) -> None:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rt = make_runtime(device="cpu", seed=0, timeout_s=60, parallelism="ddp" if world > 1 else "none")
    base = {k: v for k, v in os.environ.items() if not k.startswith("JOB_")}
    n = 0
    while True:
        job = control / f"job{n}.json"
        while not job.exists():
            time.sleep(0.005)
        time.sleep(0.005)   # written atomically by a rename; a moment for the directory entry
        spec = json.loads(job.read_text())
        if spec.get("stop"):
            break
        for k in [k for k in os.environ if k.startswith("JOB_")]:
            del os.environ[k]
        os.environ.update({**{k: v for k, v in base.items() if k not in os.environ}, **spec["env"]})
        try:
            ddp_job.main(*spec["args"])
            status = "ok"
        except BaseException:
            status = traceback.format_exc()
        sys.stdout.flush()
        (control / f"done{n}.rank{rank}.tmp").write_text(status)
        os.replace(control / f"done{n}.rank{rank}.tmp", control / f"done{n}.rank{rank}")
        n += 1
    rt.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    from hasten.runtime import leave_worker
    leave_worker(0)
