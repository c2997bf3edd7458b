"""Fault injection: hasten tried as a careless and as a hostile user would.

Each probe runs the real command line (or the library, where a fault has to be injected
into the process) in a scratch folder and checks what happened against what hasten
promises (docs/reliability.md): data never lost, every error one actionable line, no code
executed on load, exact resume. Prints a table (probe, expected, got, ok) and writes
results/fault_injection.{json,md}.

    python -m benchmarks.comparisons.fault_injection [--only SUBSTRING] [--name fault_injection]

About four minutes on two CPU cores (up to ten on a slow one); nothing needs a GPU or the network.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

from benchmarks.tools.common import REPO, git_commit, tree_dirty, write_results  # noqa: E402

TINY = """\
base: shakespeare-char-baseline
description: a tiny character model for fault probes
model: {n_layer: 1, n_head: 2, n_embd: 16}
data: {batch_size: 4, block_size: 16, eval_batch_size: 512, eval_tokens: 600}
trainer: {max_duration: 40ba, eval_interval: 20ba, log_interval: 10ba, threads: 1, tensorboard: false}
"""
PROBES = []


def probe(name: str, expected: str):
    def deco(fn):
        PROBES.append((name, expected, fn))
        return fn
    return deco


def hasten(*args, cwd, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "hasten.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def popen(*args, cwd, env=None):
    return subprocess.Popen([sys.executable, "-m", "hasten.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
                            start_new_session=True)


def python(code: str, cwd, timeout=300):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def one_line(r) -> tuple[bool, str]:
    err = r.stderr.strip()
    ok = r.returncode != 0 and len(err.splitlines()) == 1 and err.startswith("hasten: error:") and "Traceback" not in err
    return ok, f"exit {r.returncode}: {err[:150]}"


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def wait_for_step(run: Path, step: int, proc, timeout=120) -> None:
    deadline = time.time() + timeout
    m = run / "metrics.jsonl"
    while time.time() < deadline:
        if m.is_file() and any(json.loads(ln).get("step", 0) >= step for ln in m.read_text().splitlines() if ln.strip()):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended early: {proc.communicate()}")
        time.sleep(0.05)
    raise RuntimeError("the run did not reach the step in time")


def wait_for_mapping(proc, library: str, timeout=60) -> bool:
    """Wait until `proc` has `library` mapped (it is importing it); False if it ended or the time ran out first."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            if library in Path(f"/proc/{proc.pid}/maps").read_text():
                return True
        except OSError:
            return False
        time.sleep(0.002)
    return False


NOT_RUN = None
"""A probe returns (NOT_RUN, why) when its situation cannot be made here (e.g. another user's files
need root): counted apart, never as passed."""


# ---------------------------------------------------------------------------- checkpoints and data
@probe("load another run's checkpoint (keep_last=1), save", "the other run's folder unchanged")
def p_other_run(d: Path):
    assert hasten("train", "tiny.yaml", "trainer.run_dir=A", "--no-progress", cwd=d).returncode == 0
    before = snapshot(d / "A")
    r = hasten("train", "tiny.yaml", "trainer.run_dir=B", "trainer.load_path=A/checkpoints/ep0-ba40.pt",
               "trainer.max_duration=80ba", "--no-progress", cwd=d)
    same = snapshot(d / "A") == before
    return r.returncode == 0 and same, f"exit {r.returncode}; A unchanged: {same}"


@probe("resume a crafted checkpoint whose stored list names other files", "no file outside the run's folder touched")
def p_crafted(d: Path):
    assert hasten("train", "tiny.yaml", "trainer.run_dir=A", "--no-progress", cwd=d).returncode == 0
    victims = d / "victims"
    victims.mkdir()
    (victims / "ep0-ba1.pt").write_text("precious")
    (victims / "notes.txt").write_text("precious")
    r = python(f"""
        import torch
        p = torch.load("A/checkpoints/ep0-ba40.pt", weights_only=True)
        p["callbacks"]["Checkpoint"] = {{"saved": [{{"path": p_, "batch": 1, "metric": None}}
            for p_ in ["{victims}/ep0-ba1.pt", "{victims}/notes.txt", "../victims/notes.txt"]]}}
        torch.save(p, "crafted.pt")
    """, d)
    assert r.returncode == 0, r.stderr
    r = hasten("train", "tiny.yaml", "trainer.run_dir=C", "trainer.load_path=crafted.pt", "trainer.max_duration=80ba",
               "--no-progress", cwd=d)
    intact = all((victims / n).read_text() == "precious" for n in ("ep0-ba1.pt", "notes.txt"))
    return r.returncode == 0 and intact, f"exit {r.returncode}; victims intact: {intact}"


@probe("a resumed copy of a run folder", "the original folder unchanged")
def p_copy(d: Path):
    assert hasten("train", "tiny.yaml", "trainer.run_dir=A", "--no-progress", cwd=d).returncode == 0
    shutil.copytree(d / "A", d / "copy")
    before = snapshot(d / "A")
    r = hasten("train", "--resume", "copy", "trainer.max_duration=100ba", "--no-progress", cwd=d)
    same = snapshot(d / "A") == before
    return r.returncode == 0 and same, f"exit {r.returncode}; original unchanged: {same}"


@probe("two processes resume one run folder", "the second refused in one line; the first unharmed (SIGTERM: saved, exit 143)")
def p_two_writers(d: Path):
    first = popen("train", "tiny.yaml", "trainer.run_dir=R", "trainer.max_duration=100000ba", "--no-progress", cwd=d)
    wait_for_step(d / "R", 10, first)
    second = hasten("train", "--resume", "R", "--no-progress", cwd=d)
    os.killpg(first.pid, signal.SIGTERM)
    first.communicate(timeout=120)
    ok, got = one_line(second)
    return ok and "in use" in second.stderr and first.returncode == 143, f"{got}; first exit {first.returncode}"


@probe("SIGKILL during a checkpoint write", "the previous checkpoint loads; the torn temporary removed at restart")
def p_kill_during_save(d: Path):
    r = python("""
        import os, signal, sys, threading, time, torch
        from hasten import Trainer
        from hasten.callbacks import Checkpoint
        from torch.utils.data import DataLoader, TensorDataset
        x = torch.randn(64, 8); y = torch.randint(0, 4, (64,))
        cb = Checkpoint("ck", interval="2ba", keep_last=1)
        Trainer(torch.nn.Linear(8, 4), DataLoader(TensorDataset(x, y), batch_size=8), max_duration="2ba",
                device="cpu", callbacks=[cb]).fit()
        real = torch.save
        def slow(obj, f, *a, **k):          # the next write stops half-way and the process is killed
            f.write(b"half a checkpoint"); f.flush(); os.kill(os.getpid(), signal.SIGKILL)
        torch.save = slow
        Trainer(torch.nn.Linear(8, 4), DataLoader(TensorDataset(x, y), batch_size=8), max_duration="4ba",
                device="cpu", callbacks=[Checkpoint("ck", interval="2ba", keep_last=1)], autoresume=True).fit()
    """, d)
    killed = r.returncode == -signal.SIGKILL
    torn = [p.name for p in (d / "ck").iterdir() if p.name.endswith(".tmp")]
    r2 = python("""
        import torch
        from hasten import Trainer
        from hasten.callbacks import Checkpoint
        from torch.utils.data import DataLoader, TensorDataset
        x = torch.randn(64, 8); y = torch.randint(0, 4, (64,))
        t = Trainer(torch.nn.Linear(8, 4), DataLoader(TensorDataset(x, y), batch_size=8), max_duration="4ba",
                    device="cpu", callbacks=[Checkpoint("ck", interval="2ba", keep_last=1)], autoresume=True)
        print(t.state.timestamp.batch); t.fit()
    """, d)
    left = [p.name for p in (d / "ck").iterdir() if p.name.endswith(".tmp")]
    ok = killed and bool(torn) and r2.returncode == 0 and r2.stdout.split()[0] == "2" and not left
    return ok, f"killed: {killed}; torn temporaries {torn}; resumed at batch {r2.stdout.split()[:1]}; left {left}"


@probe("a checkpoint holding a pickled os.system call", "refused at load; the code never runs")
def p_malicious(d: Path):
    r = python("""
        import os, torch
        class Evil:
            def __reduce__(self):
                return (os.system, ("echo pwned > pwned.txt",))
        torch.save({"format": 1, "meta": "{}", "x": Evil()}, "evil.pt")
    """, d)
    assert r.returncode == 0, r.stderr
    r = hasten("train", "tiny.yaml", "trainer.run_dir=E", "trainer.load_path=evil.pt", "--no-progress", cwd=d)
    ok, got = one_line(r)
    pwned = (d / "pwned.txt").exists()
    return ok and not pwned, f"{got}; code ran: {pwned}"


@probe("a truncated latest checkpoint, autoresume", "skipped with a warning; resumes from the one before")
def p_truncated(d: Path):
    assert hasten("train", "tiny.yaml", "trainer.run_dir=T", "trainer.keep_last=2", "trainer.save_interval=10ba",
                  "--no-progress", cwd=d).returncode == 0
    latest = d / "T" / "checkpoints" / "ep0-ba40.pt"
    latest.write_bytes(latest.read_bytes()[:1000])
    r = hasten("train", "--resume", "T", "trainer.max_duration=50ba", "--no-progress", cwd=d)
    return r.returncode == 0 and "resuming at batch 30" in r.stdout, f"exit {r.returncode}; " + next(
        (ln for ln in r.stdout.splitlines() if "resuming" in ln), r.stderr[-150:])[:150]


@probe("disk full (ENOSPC) during a save", "one-line error; the previous checkpoint intact; no temporary left")
def p_disk_full(d: Path):
    r = python("""
        import errno, torch
        from hasten.cli import main
        assert main(["train", "tiny.yaml", "trainer.run_dir=F", "trainer.max_duration=20ba", "--no-progress"]) == 0
        def full(*a, **k):
            raise OSError(errno.ENOSPC, "No space left on device")
        torch.save = full
        raise SystemExit(main(["train", "--resume", "F", "trainer.max_duration=40ba", "--no-progress"]))
    """, d)
    ok, got = one_line(r)
    intact = (d / "F" / "checkpoints" / "ep0-ba20.pt").stat().st_size > 1000
    left = [p.name for p in (d / "F" / "checkpoints").iterdir() if p.name.endswith(".tmp")]
    return ok and "no space left" in r.stderr and intact and not left, f"{got}; intact {intact}; temporaries {left}"


@probe("an unwritable run folder (PermissionError injected)", "one-line error before any data is loaded")
def p_unwritable(d: Path):
    r = python("""
        import errno, tempfile
        import hasten.files as files
        def denied(*a, **k):
            raise PermissionError(errno.EACCES, "Permission denied")
        files.tempfile.mkstemp = denied
        from hasten.cli import main
        raise SystemExit(main(["train", "tiny.yaml", "trainer.run_dir=U", "--no-progress"]))
    """, d)
    ok, got = one_line(r)
    return ok and "no permission" in r.stderr, got


# ---------------------------------------------------------------------------- signals and resume
@probe("SIGTERM to hasten train, then the printed command", "checkpoint, exit 143; the resumed run ends as an uninterrupted one")
def p_sigterm(d: Path):
    args = ["tiny.yaml", "trainer.max_duration=1200ba", "trainer.eval_interval=600ba", "--no-progress"]
    straight = hasten("train", *args, "trainer.run_dir=S0", cwd=d)
    proc = popen("train", *args, "trainer.run_dir=S1", cwd=d)
    wait_for_step(d / "S1", 20, proc)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    cmd = out.split("Resume with: ")[-1].split()
    resumed = hasten(*cmd[1:], cwd=d)
    final = lambda r: [ln for ln in r.stdout.splitlines() if ln.startswith("final ")]
    ok = proc.returncode == 143 and cmd[:3] == ["hasten", "train", "--resume"] and final(resumed) == final(straight) != []
    return ok, f"exit {proc.returncode}; `{' '.join(cmd)}`; {final(resumed)} vs straight {final(straight)}"


@probe("Ctrl-C (SIGINT) to hasten train", "says it saves; checkpoint written; exit 130")
def p_sigint(d: Path):
    proc = popen("train", "tiny.yaml", "trainer.max_duration=100000ba", "trainer.run_dir=I", "--no-progress", cwd=d)
    wait_for_step(d / "I", 20, proc)
    os.killpg(proc.pid, signal.SIGINT)   # as a terminal does: the whole foreground group
    out, err = proc.communicate(timeout=120)
    saved = list((d / "I" / "checkpoints").glob("*.pt"))
    ok = proc.returncode == 130 and "saving a checkpoint" in err and bool(saved)
    return ok, f"exit {proc.returncode}; checkpoint {[p.name for p in saved]}"


@probe("resume with a changed learning rate", "refused in one line naming optimizer.lr and --force")
def p_resume_change(d: Path):
    assert hasten("train", "tiny.yaml", "trainer.run_dir=L", "--no-progress", cwd=d).returncode == 0
    before = (d / "L" / "recipe.yaml").read_bytes()
    r = hasten("train", "--resume", "L", "optimizer.lr=0.1", cwd=d)
    ok, got = one_line(r)
    return ok and "optimizer.lr" in r.stderr and "--force" in r.stderr and (d / "L" / "recipe.yaml").read_bytes() == before, got


@probe("a checkpoint of another optimizer", "refused in one line naming both optimizers")
def p_other_optimizer(d: Path):
    assert hasten("train", "tiny.yaml", "trainer.run_dir=O", "--no-progress", cwd=d).returncode == 0
    r = hasten("train", "tiny.yaml", "trainer.run_dir=O2", "optimizer.name=adam",
               "trainer.load_path=O/checkpoints/ep0-ba40.pt", cwd=d)
    ok, got = one_line(r)
    return ok and "AdamW" in r.stderr and "Adam" in r.stderr, got


# ---------------------------------------------------------------------------- wrong configs and data
BAD = [("optimizer.lr=-1", "optimizer.lr"), ("trainer.grad_accum=0", "grad_accum"), ("data.batch_size=0", "batch_size"),
       ("trainer.device=gpu", "not a device"), ("trainer.max_duraton=3ba", "Did you mean"),
       ("trainer.autoresume=true", "trainer.run_dir")]
for _override, _needle in BAD:
    def _make(override=_override, needle=_needle):
        def fn(d: Path):
            r = hasten("train", "tiny.yaml", override, cwd=d)
            ok, got = one_line(r)
            return ok and needle in r.stderr and not (d / "runs").exists(), got
        return fn
    probe(f"hasten train {_override}", "one-line error, exit 2, nothing written")(_make())


@probe("a YAML recipe with base: 5", "one-line error")
def p_base(d: Path):
    (d / "bad.yaml").write_text("base: 5\n")
    ok, got = one_line(hasten("train", "bad.yaml", cwd=d))
    return ok, got


def _bad_text(content: bytes, needle: str):
    def fn(d: Path):
        (d / "t.txt").write_bytes(content)
        r = hasten("train", "tiny.yaml", "data.source=t.txt", cwd=d)
        ok, got = one_line(r)
        return ok and needle in r.stderr and not (d / "runs").exists(), got
    return fn


probe("an empty text file as data.source", "one-line error naming the file")(_bad_text(b"", "empty"))
probe("a binary file as data.source", "one-line error naming the file")(_bad_text(b"\xff\xfe\x00" * 99, "UTF-8"))


def _image_zip(d: Path, broken: bytes | None = None) -> Path:
    import io as _io

    from PIL import Image
    buf = _io.BytesIO()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(buf, format="PNG")
    path = d / "img.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for split in ("train", "test"):
            for i, cls in enumerate(("airplane", "automobile")):
                zf.writestr(f"{split}/{cls}/{i:05d}.png", broken if (broken and split == "test" and i) else buf.getvalue())
    return path


def _cifar(d: Path, path: Path):
    return hasten("train", "cifar10-narrow", f"data.path={path.name}", "trainer.max_duration=1ba", cwd=d,
                  env={"HASTEN_DATA": str(d / "data")})


@probe("a truncated image zip", "one-line error naming the zip")
def p_zip(d: Path):
    z = _image_zip(d)
    z.write_bytes(z.read_bytes()[:300])
    ok, got = one_line(_cifar(d, z))
    return ok and "img.zip" in got, got


@probe("a zip member with a bad CRC", "one-line error naming the member")
def p_crc(d: Path):
    z = _image_zip(d)
    b = bytearray(z.read_bytes())
    b[b.find(b"IDAT") + 8] ^= 0xFF
    z.write_bytes(bytes(b))
    ok, got = one_line(_cifar(d, z))
    return ok and "damaged" in got, got


@probe("an undecodable image in the zip", "one-line error naming the member")
def p_undecodable(d: Path):
    ok, got = one_line(_cifar(d, _image_zip(d, broken=b"no image")))
    return ok and "00001.png" in got, got


@probe("a damaged decoded-image cache (.npz)", "warned and rebuilt; training goes on")
def p_npz(d: Path):
    z = _image_zip(d)
    r1 = python(f"from hasten.data.cifar import read_image_zip; read_image_zip('{z}', cache_dir='cache')", d)
    (cache,) = (d / "cache").glob("*.npz")
    cache.write_bytes(cache.read_bytes()[:64])
    r2 = python(f"from hasten.data.cifar import read_image_zip; print(read_image_zip('{z}', cache_dir='cache').train_x.shape)", d)
    ok = r1.returncode == 0 and r2.returncode == 0 and "damaged" in r2.stderr and "torch.Size([2, 32, 32, 3])" in r2.stdout
    return ok, f"exit {r2.returncode}; {r2.stdout.strip()}; warned: {'damaged' in r2.stderr}"


@probe("a loss function that returns a dict", "hasten's error naming what it returned")
def p_loss_dict(d: Path):
    r = python("""
        import torch
        from hasten import Trainer
        from torch.utils.data import DataLoader, TensorDataset
        dl = DataLoader(TensorDataset(torch.randn(16, 8), torch.randint(0, 4, (16,))), batch_size=8)
        try:
            Trainer(torch.nn.Linear(8, 4), dl, loss_fn=lambda o, t: {"loss": o.sum()}, max_duration="1ba", device="cpu").fit()
        except Exception as e:
            print(type(e).__name__, e)
    """, d)
    return "TrainingError the loss function returned a dict" in r.stdout, r.stdout.strip()[:150]


@probe("model outputs that do not fit the loss", "hasten's error naming both shapes")
def p_loss_shape(d: Path):
    r = python("""
        import torch
        from hasten import Trainer
        from torch.utils.data import DataLoader, TensorDataset
        dl = DataLoader(TensorDataset(torch.randn(16, 8), torch.arange(16) % 4), batch_size=8)   # 4 classes
        try:
            Trainer(torch.nn.Linear(8, 3), dl, max_duration="1ba", device="cpu").fit()
        except Exception as e:
            print(type(e).__name__, e)
    """, d)
    return r.stdout.startswith("TrainingError") and "(8, 3)" in r.stdout, r.stdout.strip()[:150]


# ---------------------------------------------------------------------------- hasten bench
for _args, _needle in ((["--target", "val/loss<<1"], "cannot read target"), (["--target", "val/loss<=1", "--seeds", "0"], "--seeds"),
                       (["--target", "val/loss<=1", "--seeds", "-1"], "--seeds")):
    def _mk(args=_args, needle=_needle):
        def fn(d: Path):
            r = hasten("bench", "tiny.yaml", *args, "--out", "b", cwd=d)
            ok, got = one_line(r)
            return ok and needle in r.stderr and not (d / "b").exists(), got
        return fn
    probe(f"hasten bench {' '.join(_args)}", "one-line error before any run")(_mk())


@probe("hasten bench with a misspelled recipe", "one-line 'did you mean', no run started")
def p_bench_typo(d: Path):
    r = hasten("bench", "shakespeare-char-basline", "--target", "val/loss<=1", "--out", "b", cwd=d)
    ok, got = one_line(r)
    return ok and "Did you mean" in r.stderr and not (d / "b").exists(), got


@probe("Ctrl-C to hasten bench", "worker stopped (no orphan), temporary folder removed, exit 130, how to continue")
def p_bench_ctrl_c(d: Path):
    tmp = d / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "hasten.cli", "bench", "tiny.yaml", "trainer.max_duration=100000ba",
                             "--target", "val/loss<=1", "--out", "b", "--name", "c"], cwd=d, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp)},
                            start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline and not list((d / "b" / "c" / "logs").glob("*.jsonl")):
        time.sleep(0.1)
    started = bool(list((d / "b" / "c" / "logs").glob("*.jsonl"))) and proc.poll() is None
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGINT)   # the terminal's foreground group: bench alone (its worker has its own session)
    out, err = proc.communicate(timeout=90)
    orphans = subprocess.run(["pgrep", "-f", f"hasten.bench.worker {tmp}"], capture_output=True, text=True).stdout.split()
    temps = list(tmp.glob("hasten-bench-*"))
    ok = started and proc.returncode == 130 and not orphans and not temps and "Continue with the same command" in err
    return ok, f"worker started: {started}; exit {proc.returncode}; orphans {orphans}; temporaries {len(temps)}"


@probe("SIGTERM to a bench worker", "recorded interrupted, not counted, rerun when continued")
def p_bench_worker_term(d: Path):
    args = ["bench", "tiny.yaml", "--target", "val/loss<=9", "--seeds", "1", "--out", str(d / "b"), "--name", "w"]
    proc = popen(*args, "trainer.max_duration=100000ba", cwd=d)
    deadline, pid = time.time() + 60, None
    while time.time() < deadline and pid is None:
        logs = list((d / "b" / "w" / "logs").glob("*.jsonl")) if (d / "b" / "w" / "logs").is_dir() else []
        found = subprocess.run(["pgrep", "-f", "hasten.bench.worker .*" + str(d)], capture_output=True, text=True).stdout.split()
        if found and logs and logs[0].read_text():
            pid = int(found[0])
        time.sleep(0.1)
    os.kill(pid, signal.SIGTERM)
    proc.communicate(timeout=120)
    runs = [json.loads(ln) for ln in (d / "b" / "w" / "runs.jsonl").read_text().splitlines()]
    report = json.loads((d / "b" / "w" / "report.json").read_text())
    counted = report["recipes"]["tiny"]["runs"]
    return runs[-1]["status"] == "interrupted" and counted == 0, f"status {runs[-1]['status']}; counted runs {counted}"


@probe("a bench run that fails", "listed as failed with its error; exit 1; strict JSON")
def p_bench_failed(d: Path):
    r = hasten("bench", "tiny.yaml+data.source=missing.txt", "--target", "val/loss<=9", "--seeds", "1", "--out", "b",
               "--name", "f", cwd=d)
    text = (d / "b" / "f" / "report.json").read_text()
    rep = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    ok = r.returncode == 1 and rep["failed"] and "missing.txt" in (rep["failed"][0]["error"] or "")
    return ok, f"exit {r.returncode}; failed: {rep['failed'][0]['error'][:100] if rep['failed'] else None}"


# ---------------------------------------------------------------------------- round two (issue 37)
TRAIN = ["tiny.yaml", "trainer.max_duration=20ba", "--no-progress"]


def _trained(d: Path, name: str = "R", *extra) -> Path:
    r = hasten("train", *TRAIN, *extra, f"trainer.run_dir={name}", cwd=d)
    assert r.returncode == 0, r.stderr[-300:]
    return d / name


@probe("2.1 `hasten compress R --out notes.txt` with notes.{txt,md,json} of the user's; `--out R/checkpoints/ep0-ba20.pt`",
       "refused in one line; the user's files and the checkpoint unchanged")
def p2_compress_out(d: Path):
    run = _trained(d)
    for n in ("notes.txt", "notes.md", "notes.json"):
        (d / n).write_text("mine")
    ckpt = next((run / "checkpoints").glob("ep*.pt"))
    before = snapshot(d)
    r1 = hasten("compress", "R", "--prune", "0.5", "--no-latency", "--out", "notes.txt", cwd=d)
    r2 = hasten("compress", "R", "--prune", "0.5", "--no-latency", "--out", str(ckpt), cwd=d)
    (ok1, g1), (ok2, g2) = one_line(r1), one_line(r2)
    return ok1 and ok2 and snapshot(d) == before, f"{g1}; {g2}"


@probe("2.2 compress twice with --finetune-lr 3.0, then 0.01", "two artifacts under two names; neither replaced")
def p2_compress_settings(d: Path):
    _trained(d)
    rs = [hasten("compress", "R", "--prune", "0.5", "--finetune", "4ba", "--finetune-lr", lr, "--no-latency", cwd=d)
          for lr in ("3.0", "0.01")]
    names = sorted(p.name for p in (d / "R" / "compressed").glob("*.hasten"))
    return all(r.returncode == 0 for r in rs) and len(names) == 2, f"artifacts {names}"


@probe("2.3 a folder holding the user's metrics.jsonl as trainer.run_dir, with trainer.load_path",
       "refused in one line before training; the user's file unchanged")
def p2_user_metrics(d: Path):
    run = _trained(d)
    (d / "mine").mkdir()
    (d / "mine" / "metrics.jsonl").write_text('not JSON\n{"step": 99}\n')
    before = snapshot(d / "mine")
    r = hasten("train", *TRAIN, "trainer.run_dir=mine", f"trainer.load_path={next((run / 'checkpoints').glob('ep*.pt'))}",
               cwd=d)
    ok, got = one_line(r)
    return ok and snapshot(d / "mine") == before, got


@probe("2.4 `hasten bench` rerun with other shared overrides (20ba, lr 0.05 after 10ba)",
       "refused in one line naming the difference; the old runs not reported as the new ones")
def p2_bench_identity(d: Path):
    first = hasten("bench", "tiny.yaml", "trainer.max_duration=10ba", "--seeds", "1", "--out", "b", "--name", "x", cwd=d)
    r = hasten("bench", "tiny.yaml", "trainer.max_duration=20ba", "optimizer.lr=0.05", "--seeds", "1", "--out", "b",
               "--name", "x", cwd=d)
    ok, got = one_line(r)
    return first.returncode == 0 and ok and "max_duration: '10ba' -> '20ba'" in r.stderr, got


@probe("2.5 `hasten train --resume R optimizer.lr=0.5 --force`", "the logged learning rate after the resume is 0.5")
def p2_forced_lr(d: Path):
    _trained(d, "R", "schedule.name=constant", "schedule.warmup=0ba", "trainer.log_interval=10ba")
    r = hasten("train", "--resume", "R", "optimizer.lr=0.5", "trainer.max_duration=30ba", "--force", "--no-progress", cwd=d)
    lrs = {row["step"]: row["train/lr"] for row in map(json.loads, (d / "R" / "metrics.jsonl").read_text().splitlines())
           if "train/lr" in row}
    return r.returncode == 0 and lrs.get(30) == 0.5, f"exit {r.returncode}; lr by step {lrs}"


@probe("2.6 a masked-LM-like batch (targets mostly -100)", "val/loss and the step's loss equal F.cross_entropy(ignore_index=-100)")
def p2_ignore_index(d: Path):
    r = python("""
        import torch, torch.nn.functional as F
        from hasten import Trainer
        torch.manual_seed(0)
        x = torch.randint(0, 11, (12, 5)); y = torch.randint(0, 11, (12, 5)); y[:, 1:] = -100
        m = torch.nn.Sequential(torch.nn.Embedding(11, 6), torch.nn.Linear(6, 11))
        true = F.cross_entropy(m(x).flatten(0, 1), y.flatten(), ignore_index=-100).item()
        t = Trainer(m, [(x, y)], eval_dataloader=[(x, y)], max_duration="1ba", device="cpu", grad_accum=3,
                    optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.0), log_interval="1ba")
        t.fit()
        print(true, t.logger.latest["train/loss"], t.state.eval_metrics["val/loss"])
    """, d)
    true, train, val = map(float, r.stdout.split())
    return abs(train - true) < 1e-5 and abs(val - true) < 1e-5, f"true {true:.4f}, train/loss {train:.4f}, val/loss {val:.4f}"


@probe("2.7 `hasten bench --target 'val/los<=4'` (a metric no run logs)", "one-line error before any run, naming what is logged")
def p2_bench_metric(d: Path):
    r = hasten("bench", "tiny.yaml", "--target", "val/los<=4", "--out", "b", cwd=d)
    ok, got = one_line(r)
    return ok and "val/loss" in r.stderr and not (d / "b").exists(), got


@probe("2.8 `hasten bench X X --seeds 2`", "'2 runs a side: no interval', never an interval from two runs; "
       "every run listed")
def p2_one_seed(d: Path):
    r = hasten("bench", "tiny.yaml", "tiny.yaml", "trainer.max_duration=10ba", "--seeds", "2", "--out", "b", cwd=d)
    found = sorted((d / "b").rglob("report.md")) if (d / "b").exists() else []
    report = found[0].read_text() if found else r.stdout
    rows = [ln for ln in report.splitlines() if ln.startswith("| tiny")]
    speedups = [ln for ln in rows if "x " in ln or ln.rstrip(" |").endswith("x")]
    every = report.split("## Every run")[-1] if "## Every run" in report else ""
    ok = (r.returncode == 0 and "2 runs a side: no interval" in report and speedups
          and not any("[" in ln for ln in speedups) and every.count("| tiny") == 4)
    return ok, next((ln for ln in report.splitlines() if "no interval" in ln), r.stderr[-150:])[:150]


@probe("2.9 SIGTERM to hasten train, then `&& next`", "checkpoint written, exit 143: the next command does not run")
def p2_sigterm_exit(d: Path):
    proc = popen("train", "tiny.yaml", "trainer.max_duration=100000ba", "--no-progress", "trainer.run_dir=T", cwd=d)
    wait_for_step(d / "T", 20, proc)
    os.kill(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=120)
    saved = list((d / "T" / "checkpoints").glob("ep*.pt"))
    return proc.returncode == 143 and bool(saved), f"exit {proc.returncode}; checkpoint {[p.name for p in saved]}"


@probe("2.10 `hasten train ... data.batch_size=1 --nproc 2`, then Ctrl-C to a second such launch",
       "the first ends (no deadlock); Ctrl-C leaves no worker behind and the run folder unlocked")
def p2_small_global_batch(d: Path):
    r = hasten("train", *TRAIN, "data.batch_size=1", "trainer.run_dir=N", "--nproc", "2", cwd=d, timeout=240)
    proc = popen("train", "tiny.yaml", "trainer.max_duration=100000ba", "--no-progress", "trainer.run_dir=M", "--nproc", "2",
                 cwd=d)
    wait_for_step(d / "M", 20, proc, timeout=180)
    os.kill(proc.pid, signal.SIGINT)
    proc.communicate(timeout=120)
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", "run_dir=M"], capture_output=True, text=True).stdout.split()
    again = hasten("train", "--resume", "M", "trainer.max_duration=40ba", "--no-progress", cwd=d)
    ok = r.returncode == 0 and not left and "in use" not in again.stderr
    return ok, f"first exit {r.returncode}; Ctrl-C exit {proc.returncode}; workers left {left}; resume exit {again.returncode}"


@probe("2.11 a Trainer over a loader with no batches (drop_last, 5 samples, batch 8)", "an error naming the loader, at once")
def p2_empty_loader(d: Path):
    r = python("""
        import torch
        from hasten import Trainer
        from torch.utils.data import DataLoader, TensorDataset
        dl = DataLoader(TensorDataset(torch.randn(5, 8), torch.zeros(5, dtype=torch.long)), batch_size=8, drop_last=True)
        try:
            Trainer(torch.nn.Linear(8, 4), dl, max_duration="20ba", device="cpu", save_folder="ck").fit()
        except Exception as e:
            print(type(e).__name__, e)
    """, d, timeout=60)
    left = list((d / "ck").glob("ep*")) if (d / "ck").exists() else []
    return r.stdout.startswith("TrainingError") and "drop_last True" in r.stdout and not left, r.stdout.strip()[:150]


@probe("2.12 a recipe with a YAML alias bomb in description:", "one-line error in seconds, no memory blow-up")
def p2_alias_bomb(d: Path):
    lines = ["base: shakespeare-char-baseline", 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)] + ["description: *a8"]
    (d / "bomb.yaml").write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    r = hasten("train", "bomb.yaml", "--no-progress", cwd=d, timeout=60)
    ok, got = one_line(r)
    return ok and time.perf_counter() - t0 < 30, got


@probe("2.13 `hasten train ... | head -n 3`", "training goes on to its end; checkpoint written; a line on stderr")
def p2_closed_stdout(d: Path):
    proc = subprocess.Popen([sys.executable, "-m", "hasten.cli", "train", *TRAIN, "trainer.run_dir=P"], cwd=d,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(2):
        proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    code = proc.wait(timeout=120)
    ok = code == 0 and (d / "P" / "checkpoints" / "ep0-ba20.pt").is_file() and "standard output was closed" in err
    return ok, f"exit {code}; {err.strip()[:120]}"


@probe("2.14 Ctrl-C while hasten imports; SIGTERM while a run is set up",
       "exit 130 and 143, one line each, no traceback; no half-made run folder")
def p2_early_signals(d: Path):
    # the `hasten` command as installed (hasten_entry, which turns a Ctrl-C during the imports into one line); the
    # signal is sent once torch's library is mapped into the process: observably inside the imports
    proc = subprocess.Popen([sys.executable, "-m", "hasten_entry", "recipes"], cwd=d, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    importing = wait_for_mapping(proc, "libtorch")
    proc.send_signal(signal.SIGINT)
    _, err1 = proc.communicate(timeout=60)
    code1 = proc.returncode
    (d / "big.txt").write_text("To be, or not to be, that is the question.\n" * 500000)
    proc = subprocess.Popen([sys.executable, "-m", "hasten.cli", "train", *TRAIN, "data.source=big.txt",
                             "trainer.run_dir=S/run"], cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (d / "S" / "run" / ".hasten.lock").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    locked = (d / "S" / "run" / ".hasten.lock").exists() and proc.poll() is None   # set up, not yet training
    proc.send_signal(signal.SIGTERM)
    _, err2 = proc.communicate(timeout=120)
    lines1, lines2 = err1.strip().splitlines(), err2.strip().splitlines()
    ok = (importing and code1 == 130 and lines1 == ["hasten: interrupted"] and locked and proc.returncode == 143
          and len(lines2) == 1 and "SIGTERM" in lines2[0] and "Traceback" not in err1 + err2 and not (d / "S").exists())
    return ok, (f"Ctrl-C {'inside' if importing else 'NOT inside'} the imports: exit {code1} {err1.strip()[:40]!r}; "
                f"SIGTERM {'during set-up' if locked else 'NOT during set-up'}: exit {proc.returncode} "
                f"{err2.strip()[:50]!r}; folder left: {(d / 'S').exists()}")


for _value, _needle in (("trainer.eval_interval=0ba", "interval"), ("data.token_dtype=float7", "token_dtype"),
                        ("algorithms.ema=5", "not a section"), ("trainer.device=cuda", "not available"),
                        ("optimizer.lr_multipliers={'*.bias': fast}", "expected a number")):
    def _mk15(value=_value, needle=_needle):
        def fn(d: Path):
            r = hasten("train", *TRAIN, value, "trainer.run_dir=V", cwd=d)
            ok, got = one_line(r)
            return ok and needle in r.stderr and r.returncode == 2 and not (d / "V").exists(), got
        return fn
    probe(f"2.15 `{_value}`", "one-line error naming the key and what is allowed, before data loads; nothing written")(_mk15())


@probe("2.15 token ids beyond the vocabulary; `hasten bench --eval-every 0ba`", "one-line errors naming the file or the option")
def p2_token_range(d: Path):
    import numpy as np
    np.arange(300, dtype=np.uint16).tofile(d / "t.bin")
    r1 = hasten("train", *TRAIN, "data.tokenizer=none", "data.train_file=t.bin", "data.val_file=t.bin", "model.vocab_size=256",
                "trainer.run_dir=W", cwd=d)
    r2 = hasten("bench", "tiny.yaml", "--eval-every", "0ba", "--out", "b", cwd=d)
    (ok1, g1), (ok2, g2) = one_line(r1), one_line(r2)
    return ok1 and ok2 and "t.bin" in r1.stderr and not (d / "W").exists(), f"{g1}; {g2}"


@probe("2.16 a checkpoint of a newer format; a model that no longer fits its checkpoint",
       "one message each: what was found, what was expected, what to do")
def p2_checkpoint_messages(d: Path):
    import torch
    run = _trained(d)
    ckpt = next((run / "checkpoints").glob("ep*.pt"))
    r1 = hasten("train", *TRAIN, "model.n_embd=32", "trainer.run_dir=X", f"trainer.load_path={ckpt}", cwd=d)
    payload = torch.load(ckpt, weights_only=True)
    payload["format"] = 2
    torch.save(payload, ckpt)
    r2 = hasten("train", "--resume", "R", "trainer.max_duration=30ba", "--no-progress", cwd=d)
    (ok1, g1), (ok2, g2) = one_line(r1), one_line(r2)
    ok = ok1 and ok2 and "is [" in r1.stderr and "newer hasten" in r2.stderr and "beginning" not in r2.stdout
    return ok, f"{g1[:80]}; {g2[:80]}"


@probe("2.17 --resume after every checkpoint was deleted; SIGKILL during compress's artifact write, then compress again",
       "each step logged once; the killed compress's torn temporary removed by the next compress")
def p2_resume_and_temporaries(d: Path):
    run = _trained(d)
    for p in (run / "checkpoints").glob("ep*.pt"):
        p.unlink()
    r = hasten("train", "--resume", "R", "--no-progress", cwd=d)
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    keys = [(row["step"], k) for row in rows for k in row if k != "step"]
    # the artifact's write stops half-way and the process is killed (as a kill at that moment would leave it)
    killed = python("""
        import io, os, signal, sys, torch
        real = torch.save
        def half(obj, f, *a, **k):
            if isinstance(f, io.BytesIO):
                return real(obj, f, *a, **k)
            f.write(b"half an artifact"); f.flush(); os.kill(os.getpid(), signal.SIGKILL)
        torch.save = half
        from hasten.cli import main
        sys.exit(main(["compress", "R", "--prune", "0.5", "--no-latency"]))
    """, d)
    torn = sorted(p.name for p in (run / "compressed").glob(".*.tmp")) if (run / "compressed").exists() else []
    again = hasten("compress", "R", "--prune", "0.5", "--no-latency", cwd=d)
    left = [p.name for p in (run / "compressed").glob(".*.tmp")]
    artifacts = [p.name for p in (run / "compressed").glob("*.hasten")]
    ok = (r.returncode == 0 and keys and len(keys) == len(set(keys)) and killed.returncode == -signal.SIGKILL
          and torn and again.returncode == 0 and not left and artifacts)
    return ok, (f"steps once: {bool(keys) and len(keys) == len(set(keys))}; killed {killed.returncode == -signal.SIGKILL}, "
                f"torn temporaries {torn}; after the next compress: left {left}, artifacts {artifacts}")


@probe("2.18 EMA whose average is worse than the trained weights (a short BN run)",
       "the better weights kept and said; without an evaluation set, what was put in is said")
def p2_ema_worse(d: Path):
    r = python("""
        import warnings, torch
        from hasten import Trainer
        from hasten.algorithms import EMA
        torch.manual_seed(0)
        x = torch.randn(256, 8); y = (x @ torch.randn(8, 4)).argmax(1)
        data = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)]
        for ev in (data, None):
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                t = Trainer(net, data, eval_dataloader=ev, max_duration="16ba", eval_interval="16ba", device="cpu",
                            algorithms=[EMA(decay=0.9)], optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.5))
                t.fit()
            print([str(m.message) for m in w if "ema" in str(m.message)])
    """, d)
    lines = r.stdout.strip().splitlines()
    ok = len(lines) == 2 and "kept" in lines[0] and "untested" in lines[1]
    return ok, "; ".join(lines)[:150] or r.stderr[-150:]


# ---------------------------------------------------------------------------- round three
CORPUS_WORDS = "the quick brown fox jumps over a lazy dog while seven wise owls sing of rivers".split()


def _corpus(path: Path, docs: int = 30, extra: str = "") -> Path:
    import random
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(docs):
            f.write(json.dumps({"text": " ".join(rng.choice(CORPUS_WORDS) for _ in range(60)) + extra}) + "\n")
    return path


BPE_TRAIN = ["tiny.yaml", "data.tokenizer=bpe", "data.source=c.jsonl", "data.vocab_size=300", "trainer.max_duration=4ba",
             "trainer.eval_interval=4ba", "--no-progress"]


def _fsdp_dcp(d: Path, code_after: str) -> subprocess.CompletedProcess:
    """A sharded (.dcp) checkpoint written by an FSDP run in one process, its .metadata replaced
    by a pickle whose loading runs `touch PWNED`; then `code_after` runs."""
    return python("""
        import os, pickle, torch
        from hasten import Trainer, make_runtime
        from torch.utils.data import DataLoader, TensorDataset
        class Payload:
            def __reduce__(self):
                return (os.system, ("touch PWNED",))
        def net():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        dl = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,))), batch_size=8)
        rt = make_runtime(device="cpu", parallelism="fsdp")
        Trainer(net(), dl, max_duration="4ba", runtime=rt, save_folder="ck", save_interval="4ba").fit(summary=False)
        open("ck/ep0-ba4.dcp/.metadata", "wb").write(pickle.dumps({"x": Payload()}))
    """ + textwrap.dedent(code_after).replace("\n", "\n        "), d, timeout=180)


@probe("3.1 a crafted .dcp whose .metadata runs a command: trainer.load_path, autoresume, compress's export",
       "refused in one line at each entry; the command never runs")
def p3_dcp(d: Path):
    r = _fsdp_dcp(d, """
        from hasten.checkpoint.sharded import export_whole
        for how in ("load_path", "autoresume", "export"):
            try:
                if how == "load_path":
                    Trainer(net(), dl, max_duration="6ba", runtime=rt, load_path="ck/ep0-ba4.dcp")
                elif how == "autoresume":
                    Trainer(net(), dl, max_duration="6ba", runtime=rt, save_folder="ck", autoresume=True)
                else:
                    export_whole("ck/ep0-ba4.dcp", "whole.pt")
                print(how, "LOADED")
            except Exception as e:
                print(how, type(e).__name__, str(e).splitlines()[0][:60])
        print("ran:", os.path.exists("PWNED"))
    """)
    lines = r.stdout.strip().splitlines()
    ok = len(lines) == 4 and all("CheckpointError" in ln for ln in lines[:3]) and lines[3] == "ran: False"
    return ok, "; ".join(lines)[:200] or r.stderr[-200:]


@probe("3.2 another user's recipe naming os:system; `trainer.run_dir=THEIRS trainer.autoresume=true`",
       "each refused in one line naming --trust-code; nothing imported")
def p3_trust(d: Path):
    if os.geteuid() != 0:
        return NOT_RUN, "not run: making a file of another user needs root"
    theirs = d / "theirs"
    theirs.mkdir()
    (theirs / "recipe.yaml").write_text(TINY.replace("model: {", "model: {name: 'os:system', "))
    for p in [theirs, *theirs.rglob("*")]:
        os.chown(p, 65534, 65534)
    r1 = hasten("train", "theirs/recipe.yaml", "--no-progress", cwd=d)
    _trained(d, "T")
    import yaml
    stored = yaml.safe_load((d / "T" / "recipe.yaml").read_text())
    stored["model"]["name"] = "os:system"
    (d / "T" / "recipe.yaml").write_text(yaml.safe_dump(stored, sort_keys=False))
    for p in [d / "T", *(d / "T").rglob("*")]:
        os.chown(p, 65534, 65534)
    r2 = hasten("train", "T/recipe.yaml", "trainer.run_dir=T", "trainer.autoresume=true", "--no-progress", cwd=d)
    (ok1, g1), (ok2, g2) = one_line(r1), one_line(r2)
    return ok1 and ok2 and "--trust-code" in r1.stderr + r2.stderr, f"{g1[:90]}; {g2[:90]}"


@probe("3.3 data.source=https://...#sha256=../../../E/x", "one line; no folder made outside the data folder")
def p3_fragment(d: Path):
    r = hasten("train", "tiny.yaml", "data.tokenizer=bpe", "data.source=https://example.com/c.jsonl#sha256=../../../E/x",
               cwd=d, env={"HASTEN_DATA": str(d / "data" / "a" / "b")})
    ok, got = one_line(r)
    return ok and not (d / "E").exists() and not (d / "data" / "E").exists(), got


@probe("3.4 `hasten tune --out DIR` and `hasten bench --out DIR` over the user's tuned.yaml / report.md",
       "refused in one line before any trial; the user's files unchanged")
def p3_tune_out(d: Path):
    (d / "mine").mkdir()
    (d / "mine" / "tuned.yaml").write_text("mine\n")
    (d / "b" / "x").mkdir(parents=True)
    (d / "b" / "x" / "report.md").write_text("mine\n")
    t0 = time.perf_counter()
    r1 = hasten("tune", "tiny.yaml", "--budget", "1m", "--out", "mine", cwd=d)
    r2 = hasten("bench", "tiny.yaml", "--out", "b", "--name", "x", cwd=d)
    (ok1, g1), (ok2, g2) = one_line(r1), one_line(r2)
    same = (d / "mine" / "tuned.yaml").read_text() == "mine\n" == (d / "b" / "x" / "report.md").read_text()
    return ok1 and ok2 and same and time.perf_counter() - t0 < 60, f"{g1[:90]}; {g2[:90]}"


_FLAKY_MLFLOW = """
    import sys, mlflow.tracking
    calls = [0]
    real = mlflow.tracking.MlflowClient.log_batch
    def flaky(self, run_id, metrics=(), params=(), tags=(), **kw):
        if metrics:
            calls[0] += 1
            if calls[0] == 3:
                raise ConnectionError("503 Service Unavailable")
        return real(self, run_id, metrics=metrics, params=params, tags=tags, **kw)
    mlflow.tracking.MlflowClient.log_batch = flaky
    from hasten.cli import main
    sys.exit(main(["train", "tiny.yaml", "trainer.max_duration=40ba", "--no-progress", "trainer.run_dir=RUN",
                   "trainer.mlflow={tracking_uri: 'sqlite:///m.db'}", EXTRA]))
"""


@probe("3.5 an MLflow log_batch raising (503) at the third metrics call",
       "default: one warning, training ends normally; on_logger_error=stop: checkpoint, resume line, exit 1")
def p3_tracker_outage(d: Path):
    r1 = python(_FLAKY_MLFLOW.replace("RUN", "A").replace("EXTRA", "'trainer.log_interval=10ba'"), d)
    r2 = python(_FLAKY_MLFLOW.replace("RUN", "B").replace("EXTRA", "'trainer.on_logger_error=stop'"), d)
    warned = "hasten: warning: MLflowLogger failed logging metrics" in r1.stderr
    saved = list((d / "B" / "checkpoints").glob("ep*.pt"))
    ok = r1.returncode == 0 and warned and r2.returncode == 1 and bool(saved) and "hasten train --resume B" in r2.stdout
    return ok, f"default exit {r1.returncode}, warned {warned}; stop exit {r2.returncode}, {[p.name for p in saved]}"


@probe("3.6 texts beginning 'Review: ', 'Q: ', 'Note: ', a URL, with data.headers: subject",
       "left whole (not e-mails)")
def p3_headers(d: Path):
    r = python(r"""
        from hasten.tasks.text_classification import strip_headers
        texts = ["Review: great\n\nloved it", "Q: why?\n\nA: so", "Note: x", "https://a.b/c\n\nd"]
        print(sum(strip_headers(t, "subject") == t for t in texts))
    """, d)
    return r.stdout.strip() == "4", f"{r.stdout.strip()} of 4 texts left whole {r.stderr[-100:]}"


@probe("3.7 --resume after a document was appended to the BPE corpus", "refused in one line: the tokenizer changed")
def p3_tokenizer(d: Path):
    _corpus(d / "c.jsonl")
    r1 = hasten("train", *BPE_TRAIN, "trainer.run_dir=L", cwd=d)
    with open(d / "c.jsonl", "a") as f:
        f.write(json.dumps({"text": "zebra quartz jinx vex " * 20}) + "\n")
    r2 = hasten("train", "--resume", "L", "trainer.max_duration=8ba", "--no-progress", cwd=d)
    ok, got = one_line(r2)
    return r1.returncode == 0 and ok and "tokenizer" in r2.stderr, got


@probe("3.8 labels `Spam`/`spam`; 1 and 1.0; null; data.val_folders=[hrad]",
       "each refused in one line naming the labels or the folder")
def p3_labels(d: Path):
    got, oks = [], []
    for rows, extra in (([("spam", "a"), ("Spam", "a"), ("ham", "a")], []), ([(1, "a"), (1.0, "a"), (0, "a")], []),
                        ([("spam", "a"), (None, "a"), ("ham", "a")], []),
                        ([("spam", "a"), ("ham", "hard")], ["data.val_folders=[hrad]"])):
        with open(d / "l.jsonl", "w") as f:
            for i in range(40):
                label, folder = rows[i % len(rows)]
                f.write(json.dumps({"text": f"text {i}", "label": label, "id": str(i), "folder": folder}) + "\n")
        r = hasten("train", "spam-bert-finetune", "data.source=l.jsonl", *extra, "--no-progress", cwd=d)
        ok, g = one_line(r)
        oks.append(ok)
        got.append(g[8:70])
    return all(oks), "; ".join(got)


@probe("3.9 two `hasten tune` into one --out; a recipe that cannot train",
       "the second refused in one line while the first runs; the failing recipe: one line, no tuned.yaml, nothing cached")
def p3_tune_twice(d: Path):
    first = popen("tune", "tiny.yaml", "--budget", "1m", "--out", "o", cwd=d)
    deadline = time.time() + 60
    while not (d / "o" / ".hasten.lock").exists() and time.time() < deadline:
        time.sleep(0.05)
    second = hasten("tune", "tiny.yaml", "--budget", "1m", "--out", "o", cwd=d)
    os.killpg(first.pid, signal.SIGTERM)
    first.communicate(timeout=60)
    bad = hasten("tune", "tiny.yaml", "data.source=nothere.txt", "--budget", "1m", "--out", "bad", cwd=d,
                 env={"HASTEN_DATA": str(d / "hd")})
    (ok1, g1), (ok2, g2) = one_line(second), one_line(bad)
    cached = list((d / "hd" / "tune").glob("*.json")) if (d / "hd" / "tune").exists() else []
    ok = ok1 and "in use" in second.stderr and ok2 and not (d / "bad" / "tuned.yaml").exists() and not cached
    return ok, f"{g1[:80]}; {g2[:80]}"


@probe("3.10 a small zip holding one 64 MiB line as a BPE corpus; SIGTERM while a BPE tokenizer trains",
       "one line naming the limit within seconds; the command ends within 2 s of SIGTERM, no child left")
def p3_bomb(d: Path):
    with zipfile.ZipFile(d / "bomb.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.txt", "x" * (64 << 20))
    t0 = time.perf_counter()
    r = hasten("train", "tiny.yaml", "data.tokenizer=bpe", "data.source=bomb.zip", "--no-progress", cwd=d, timeout=120)
    took = time.perf_counter() - t0
    ok1, g1 = one_line(r)
    with open(d / "big.jsonl", "w") as f:
        for i in range(3000):
            f.write(json.dumps({"text": " ".join(str(i * j) for j in range(3000))}) + "\n")
    proc = popen("train", "tiny.yaml", "data.tokenizer=bpe", "data.source=big.jsonl", "data.vocab_size=60000",
                 "trainer.run_dir=Z", "--no-progress", cwd=d)
    time.sleep(8)
    kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    t1 = time.perf_counter()
    os.kill(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=60)
    stop_s = time.perf_counter() - t1
    time.sleep(0.3)
    left = [k for k in kids if Path(f"/proc/{k}").exists()]
    ok = ok1 and "HASTEN_MAX" in r.stderr and took < 30 and stop_s < 2 and not left
    return ok, f"{g1[:80]} in {took:.1f} s; SIGTERM: ended in {stop_s:.1f} s, children {len(kids)}, left {left}"


@probe("3.11 trainer.mlflow at a server that is not there; an sqlite store that is a folder",
       "one line naming trainer.mlflow, within 30 s each")
def p3_tracker_setup(d: Path):
    (d / "store").mkdir()
    got, oks = [], []
    for uri in ("http://127.0.0.1:9", "sqlite:///store"):
        t0 = time.perf_counter()
        r = hasten("train", *TRAIN, f"trainer.mlflow={{tracking_uri: '{uri}'}}", "trainer.run_dir=M", cwd=d, timeout=120)
        took = time.perf_counter() - t0
        ok, g = one_line(r)
        oks.append(ok and "trainer.mlflow" in r.stderr and took < 35)
        got.append(f"{g[:70]} ({took:.0f} s)")
    return all(oks), "; ".join(got)


@probe("3.12 SIGTERM to hasten tune while a trial runs", "exit 143; no trial worker left; its temporary folder removed")
def p3_tune_sigterm(d: Path):
    before = set(Path(tempfile.gettempdir()).glob("hasten-tune-*"))
    proc = popen("tune", "tiny.yaml", "--budget", "2m", "--out", "o", cwd=d)
    deadline = time.time() + 60
    while time.time() < deadline and not (set(Path(tempfile.gettempdir()).glob("hasten-tune-*")) - before):
        time.sleep(0.1)
    time.sleep(2)
    kids = subprocess.run(["pgrep", "-f", "hasten.tune.worker"], capture_output=True, text=True).stdout.split()
    os.kill(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=60)
    time.sleep(1)
    left = [k for k in kids if Path(f"/proc/{k}").exists()]
    temps = set(Path(tempfile.gettempdir()).glob("hasten-tune-*")) - before
    ok = proc.returncode == 143 and bool(kids) and not left and not temps
    return ok, f"exit {proc.returncode}; workers {len(kids)}, left {left}; temporaries left {len(temps)}"


@probe("3.13 an image zip copied with `cp -p` over another of the same stem, size and time, other labels",
       "the decoded cache of each is its own: labels from the zip given")
def p3_image_cache(d: Path):
    a, b = _image_zip(d), d / "b" / "cifar.zip"
    b.parent.mkdir()
    r = python(f"""
        import os, zipfile
        src = zipfile.ZipFile({str(a)!r})
        with zipfile.ZipFile({str(b)!r}, "w") as z:
            swap = {{"bird": "deer", "deer": "bird", "cat": "dog", "dog": "cat", "horse": "truck", "truck": "horse",
                    "frog": "ship", "ship": "frog"}}   # names of equal length: the same archive size
            for n in src.namelist():   # the same images under other class folders: other labels
                parts = n.split("/")
                if len(parts) == 3:
                    parts[1] = swap.get(parts[1], parts[1])
                z.writestr("/".join(parts), src.read(n))
        st = os.stat({str(a)!r})
        os.utime({str(b)!r}, (st.st_atime, st.st_mtime))
        print(os.path.getsize({str(b)!r}) == st.st_size)
        os.environ["HASTEN_DATA"] = {str(d / 'hd')!r}
        from hasten.data.cifar import read_image_zip
        da, db = read_image_zip({str(a)!r}), read_image_zip({str(b)!r})
        # the same images under other folders: read the same way, their labels per image differ
        print(sum(1 for i in range(len(da.train_y)) for j in range(len(db.train_y))
                  if int(da.train_y[i]) != int(db.train_y[j]) and bool((da.train_x[i] == db.train_x[j]).all())))
    """, d)
    out = r.stdout.split()
    ok = len(out) == 2 and out[0] == "True" and int(out[1]) > 0
    return ok, f"same size: {out[:1]}; labels that differ between the two: {out[1:]} {r.stderr[-100:]}"


for _name, _kw, _needle in (
        ("an artifact whose meta has no recipe", "no_recipe", "holds no recipe"),
        ("an artifact whose meta nests 100k `[`", "nested", "nested deeper than anything hasten writes"),
        ("a checkpoint whose timestamp is {'batch': 'forty'}", "forty", "field batch"),
        ("a checkpoint whose timestamp is {'get': 5}", "get", "unknown field 'get'")):
    def _mk_meta(kw=_kw, needle=_needle):
        def fn(d: Path):
            run = _trained(d)
            ckpt = next((run / "checkpoints").glob("ep*.pt"))
            if kw in ("no_recipe", "nested"):
                r0 = hasten("compress", "R", "--prune", "0.5", "--no-latency", "--out", "a.hasten", cwd=d)
                assert r0.returncode == 0, r0.stderr[-200:]
                target = d / "a.hasten"
            else:
                target = ckpt
            python(f"""
                import json, torch
                p = torch.load({str(target)!r}, weights_only=True)
                meta = json.loads(p["meta"])
                if {kw!r} == "no_recipe": meta.pop("recipe")
                elif {kw!r} == "forty": meta["timestamp"] = {{"batch": "forty"}}
                elif {kw!r} == "get": meta["timestamp"] = {{"get": 5}}
                p["meta"] = "[" * 100000 if {kw!r} == "nested" else json.dumps(meta)
                torch.save(p, {str(target)!r})
            """, d)
            r = (hasten("eval", "a.hasten", cwd=d) if kw in ("no_recipe", "nested") else
                 hasten("train", *TRAIN, "trainer.run_dir=N", f"trainer.load_path={ckpt}", cwd=d))
            ok, got = one_line(r)
            return ok and needle in r.stderr and not (d / "N").exists(), got
        return fn
    probe(f"3.14 {_name}", "one line: what was found, what hasten writes; no run folder left")(_mk_meta())


@probe("3.15 `base: ../d1/loop.yaml` inside d1/loop.yaml", "one short line naming the loop")
def p3_base_loop(d: Path):
    (d / "d1").mkdir()
    (d / "d1" / "loop.yaml").write_text("base: ../d1/loop.yaml\n")
    r = hasten("train", "d1/loop.yaml", cwd=d)
    ok, got = one_line(r)
    return ok and "loops back" in r.stderr and len(r.stderr) < 400, got


for _value, _needle in (("trainer.seed=1e30", "trainer.seed"), ("trainer.memory_limit=1.5.5MB", "trainer.memory_limit"),
                        ("trainer.mlflow={experiment: 5}", "trainer.mlflow")):
    def _mk_key(value=_value, needle=_needle):
        def fn(d: Path):
            r = hasten("train", *TRAIN, value, "trainer.run_dir=K", cwd=d)
            ok, got = one_line(r)
            return ok and needle in r.stderr and not (d / "K").exists(), got
        return fn
    probe(f"3.16 `{_value}`", "one line naming the key")(_mk_key())


@probe("3.17 a damaged token cache (.npz); HASTEN_DATA pointing at a file",
       "the cache rebuilt and training goes on; HASTEN_DATA: one line")
def p3_caches(d: Path):
    _corpus(d / "c.jsonl")
    hd = {"HASTEN_DATA": str(d / "hd")}
    r1 = hasten("train", *BPE_TRAIN, "trainer.run_dir=C1", cwd=d, env=hd)
    for npz in (d / "hd" / "tokens").glob("*.npz"):
        npz.write_bytes(b"PK\x03\x04 damaged")
    r2 = hasten("train", *BPE_TRAIN, "trainer.run_dir=C2", cwd=d, env=hd)
    (d / "file").write_text("x")
    r3 = hasten("train", *BPE_TRAIN, "trainer.run_dir=C3", cwd=d, env={"HASTEN_DATA": str(d / "file")})
    ok3, g3 = one_line(r3)
    return r1.returncode == 0 and r2.returncode == 0 and ok3, f"token cache: exit {r2.returncode}; {g3[:90]}"


@probe("3.18 a factory dataset without targets; trainer.profile=10 in a 3-step run; a model module calling sys.exit(3)",
       "one line naming the factory; a warning that nothing was profiled; one line naming the module")
def p3_user_code(d: Path):
    (d / "nt.py").write_text("import torch\nfrom torch.utils.data import Dataset\n\n\nclass D(Dataset):\n"
                             "    def __len__(self):\n        return 16\n\n    def __getitem__(self, i):\n"
                             "        return torch.zeros(4, dtype=torch.long)\n\n\ndef make():\n    return D(), None\n")
    (d / "ex.py").write_text("import sys\nsys.exit(3)\n")
    r1 = hasten("train", *TRAIN, "data.factory=nt:make", "model.vocab_size=65", "trainer.run_dir=F1", cwd=d)
    r2 = hasten("train", "tiny.yaml", "trainer.max_duration=3ba", "trainer.profile=10", "--no-progress",
                "trainer.run_dir=F2", cwd=d)
    r3 = hasten("train", *TRAIN, "model.name=ex:Net", "trainer.run_dir=F3", cwd=d)
    (ok1, g1), (ok3, g3) = one_line(r1), one_line(r3)
    warned = "nothing was profiled" in r2.stderr
    return ok1 and r2.returncode == 0 and warned and ok3, f"{g1[:60]}; warned {warned}; {g3[:60]}"


# ---------------------------------------------------------------------------- round four (issue 92)
STREAM_GPT = ["prose-gpt-baseline", "model.n_layer=1", "model.n_head=2", "model.n_embd=16", "data.block_size=16",
              "data.batch_size=4", "data.eval_batch_size=8", "data.eval_tokens=256", "trainer.eval_interval=8ba",
              "trainer.precision=fp32", "trainer.tensorboard=false", "trainer.threads=1", "--no-progress"]


def one_error(r) -> tuple[bool, str]:
    """Exit non-zero with exactly one `hasten: error:` line, the last, and no traceback; hasten's
    notices (that a run folder it made was removed) and other libraries' log lines from before
    the error (transformers' model-config warnings) may stand before it."""
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("hasten: error:")]
    ok = (r.returncode != 0 and len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in r.stderr)
    return ok, f"exit {r.returncode}: {(errors or lines or [''])[0][:150]}"


def _prepared(d: Path, name: str = "src", seed: int = 0) -> tuple[Path, dict]:
    """A tiny token source prepared by the command line, in many small shards; its manifest."""
    corpus = d / "stream-corpus.jsonl"
    if not corpus.exists():
        _corpus(corpus, docs=40)
    r = hasten("data", "prepare", str(corpus), "--out", name, "--block-size", "16", "--vocab-size", "300",
               "--shard-mb", "0.004", "--seed", str(seed), "--no-progress", cwd=d)
    assert r.returncode == 0, r.stderr[-500:]
    return d / name, json.loads((d / name / "hasten-stream.json").read_text())


def _same_rows_other_content(shard: Path) -> None:
    """The shard rewritten with the same rows (count and schema), each window's tokens reversed."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    t = pq.read_table(shard)
    width = t.schema.field("tokens").type.list_size
    tokens = t.column("tokens").combine_chunks().flatten().to_numpy().reshape(-1, width)[:, ::-1].copy()
    pq.write_table(pa.table({"tokens": pa.FixedSizeListArray.from_arrays(tokens.reshape(-1), width),
                             "segments": t.column("segments")}), shard)


@probe("4.1 every training shard of a local source replaced (same rows, other content), manifest unchanged",
       "refused in one line naming a shard, before its rows are used")
def p4_replaced(d: Path):
    src, m = _prepared(d)
    for s in m["splits"]["train"]["shards"]:
        _same_rows_other_content(src / s["name"])
    r = hasten("train", *STREAM_GPT, "data.source=src", "trainer.max_duration=8ba", "trainer.run_dir=R", cwd=d)
    ok, got = one_error(r)
    named = any(s["name"] in r.stderr for s in m["splits"]["train"]["shards"])
    return ok and named and "changed since it was prepared" in r.stderr and not (d / "R" / "checkpoints").exists(), got


@probe("4.1 shards replaced between a checkpoint and --resume", "the resume refused in one line naming the shard")
def p4_replaced_before_resume(d: Path):
    src, m = _prepared(d)
    r = hasten("train", *STREAM_GPT, "data.source=src", "trainer.max_duration=8ba", "trainer.save_interval=4ba",
               "trainer.keep_last=2", "trainer.run_dir=R", cwd=d)
    assert r.returncode == 0, r.stderr[-500:]
    (d / "R" / "checkpoints" / "ep0-ba8.pt").unlink()
    for s in m["splits"]["train"]["shards"]:
        _same_rows_other_content(src / s["name"])
    r = hasten("train", "--resume", "R", "--no-progress", cwd=d)
    ok, got = one_error(r)
    return ok and "changed since it was prepared" in r.stderr and not (d / "R" / "checkpoints" / "ep0-ba8.pt").exists(), got


@probe("4.1 the source prepared again (other shards, the same tokenizer) between a checkpoint and --resume",
       "the resume refused in one line: the checkpoint was trained on other data")
def p4_reprepared_before_resume(d: Path):
    src, m = _prepared(d)
    r = hasten("train", *STREAM_GPT, "data.source=src", "trainer.max_duration=8ba", "trainer.save_interval=4ba",
               "trainer.keep_last=2", "trainer.run_dir=R", cwd=d)
    assert r.returncode == 0, r.stderr[-500:]
    (d / "R" / "checkpoints" / "ep0-ba8.pt").unlink()
    shutil.rmtree(src)
    _, again = _prepared(d, seed=1)
    assert again["digest"] != m["digest"] and again["tokenizer_sha256"] == m["tokenizer_sha256"]
    r = hasten("train", "--resume", "R", "--no-progress", cwd=d)
    ok, got = one_error(r)
    return ok and "was trained on" in r.stderr and "other data" in r.stderr, got


@probe("4.1 a manifest whose SHA-256 of a shard is wrong", "refused in one line before training")
def p4_wrong_sha(d: Path):
    src, m = _prepared(d)
    m["splits"]["train"]["shards"][0]["sha256"] = "0" * 64
    (src / "hasten-stream.json").write_text(json.dumps(m))
    r = hasten("train", *STREAM_GPT, "data.source=src", "trainer.max_duration=4ba", "trainer.run_dir=R", cwd=d)
    ok, got = one_error(r)
    return ok and "hasten-stream.json" in r.stderr and not (d / "R").exists(), got


def _worker_case(change, needle_of):
    def fn(d: Path):
        src, m = _prepared(d)
        shard = m["splits"]["train"]["shards"][0]["name"]
        change(src, m, shard)
        got, lines = [], []
        for w in (0, 2):
            r = hasten("train", *STREAM_GPT, "data.source=src", f"data.num_workers={w}", "trainer.max_duration=4ba",
                       f"trainer.run_dir=R{w}", cwd=d)
            ok, g = one_error(r)
            got.append(g)
            lines.append((ok and needle_of(shard) in r.stderr, next((ln for ln in r.stderr.splitlines()
                                                                     if ln.startswith("hasten: error:")), "")))
        same = lines[0][1] == lines[1][1]
        return all(ok for ok, _ in lines) and same, f"0 and 2 workers {'the same line' if same else 'differ'}: {got[1]}"
    return fn


def _truncate(src, m, shard):
    (src / shard).write_bytes((src / shard).read_bytes()[:500])


def _text(src, m, shard):
    (src / shard).write_text("not a shard\n" * 40)


def _missing(src, m, shard):
    (src / shard).unlink()


def _empty_name(src, m, shard):
    m["splits"]["train"]["shards"][0]["name"] = ""
    (src / "hasten-stream.json").write_text(json.dumps(m))


for _label, _change, _needle in [
        ("a shard truncated to 500 bytes", _truncate, lambda s: s),
        ("a shard replaced by a text file", _text, lambda s: s),
        ("a shard listed in the manifest but missing", _missing, lambda s: f"{s} is missing"),
        ("a manifest shard entry with an empty name", _empty_name, lambda s: "not a file name inside the source")]:
    probe(f"4.2 {_label}, 0 and 2 loader workers", "one line naming the shard, the same whatever the worker count")(
        _worker_case(_change, _needle))


@probe("4.2 shards replaced in an S3 bucket (an S3-compatible server on the loopback address), 2 loader workers",
       "one line naming the shard and that it changed in the store")
def p4_s3_replaced(d: Path):
    import logging

    import boto3
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.ERROR)   # the server's request log
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{server._server.server_port}"
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "probe", "AWS_SECRET_ACCESS_KEY": "probe",
               "AWS_DEFAULT_REGION": "us-east-1"}
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="probe",
                          aws_secret_access_key="probe")
        s3.create_bucket(Bucket="data")
        src, m = _prepared(d)
        for p in sorted(src.iterdir()):
            s3.put_object(Bucket="data", Key=f"src/{p.name}", Body=p.read_bytes())
        for s in m["splits"]["train"]["shards"]:
            _same_rows_other_content(src / s["name"])
            s3.put_object(Bucket="data", Key=f"src/{s['name']}", Body=(src / s["name"]).read_bytes())
        r = hasten("train", *STREAM_GPT, "data.source=s3://data/src", "data.num_workers=2", "trainer.max_duration=4ba",
                   "trainer.run_dir=R", "data.stream_cache=cache", cwd=d, env=env)
    finally:
        server.stop()
    ok, got = one_error(r)
    cached = [p.name for p in (d / "cache").rglob("*.parquet")]
    return ok and "changed in the store" in r.stderr and not cached, f"{got}; cached {cached}"


@probe("4.3 a manifest whose tokenizer path leaves the source ('../planted/tok.json', the right tokenizer planted)",
       "the manifest refused in one line; nothing outside the source read")
def p4_tokenizer_path(d: Path):
    src, m = _prepared(d)
    (d / "planted").mkdir()
    shutil.copy(src / "tokenizer.json", d / "planted" / "tok.json")   # the same tokenizer: only the path is wrong
    m["tokenizer"] = "../planted/tok.json"
    (src / "hasten-stream.json").write_text(json.dumps(m))
    r = hasten("train", *STREAM_GPT, "data.source=src", "trainer.max_duration=4ba", "trainer.run_dir=R", cwd=d)
    ok, got = one_error(r)
    return ok and "not a file name inside the source" in r.stderr, got


def _serve(folder: Path):
    import functools
    import http.server
    import threading
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@probe("4.4 a signed object-store URL (`.../docs.jsonl?X-Amz-Signature=...#sha256=...`, a server on the loopback address)",
       "read as JSON lines (its type from the URL's path); the run trains")
def p4_query_url(d: Path):
    import hashlib
    (d / "site").mkdir()
    _corpus(d / "site" / "docs.jsonl", docs=30)
    sha = hashlib.sha256((d / "site" / "docs.jsonl").read_bytes()).hexdigest()
    server = _serve(d / "site")
    try:
        url = f"http://127.0.0.1:{server.server_port}/docs.jsonl?X-Amz-Signature=abc&X-Amz-Expires=60#sha256={sha}"
        r = hasten("train", *BPE_TRAIN[:2], f"data.source={url}", *BPE_TRAIN[3:], "trainer.run_dir=R", cwd=d,
                   env={"HASTEN_DATA": str(d / "data")})
    finally:
        server.shutdown()
    cached = [p.name for p in (d / "data" / "corpora").rglob("*") if p.is_file()] if (d / "data" / "corpora").exists() else []
    ok = r.returncode == 0 and cached == ["docs.jsonl"] and "final val/loss" in r.stdout
    return ok, f"exit {r.returncode}; cached as {cached}; {r.stderr.strip()[-100:]}"


@probe("4.5 a file:// corpus URL whose #sha256 is wrong", "one line; nothing left in the data folder")
def p4_wrong_sha_url(d: Path):
    _corpus(d / "c.jsonl")
    r = hasten("train", *BPE_TRAIN[:2], f"data.source=file://{d / 'c.jsonl'}#sha256={'0' * 64}", *BPE_TRAIN[3:],
               "trainer.run_dir=R", cwd=d, env={"HASTEN_DATA": str(d / "data")})
    ok, got = one_error(r)
    left = [str(p.relative_to(d)) for p in (d / "data").rglob("*")] if (d / "data").exists() else []
    return ok and "sha256" in r.stderr and not left, f"{got}; left {left}"


HF_GPT = ["prose-gpt-baseline", "data.source=c.jsonl", "data.vocab_size=300", "data.block_size=16",
          "model={name: hf/gpt2, n_layer: 1, n_embd: 32, n_head: 2, n_positions: 32}", "data.batch_size=8",
          "trainer.max_duration=1ba", "trainer.eval_interval=1ba", "schedule.warmup=1ba", "trainer.precision=fp32",
          "trainer.threads=1", "--no-progress"]


@probe("4.6 trainer.load_path naming a BERT's safetensors for an hf/gpt2 model",
       "refused in one line saying how many tensors fit (0)")
def p4_other_architecture(d: Path):
    _corpus(d / "c.jsonl")
    r0 = python("""
        import transformers
        transformers.BertModel(transformers.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=64)).save_pretrained("bert")
    """, d)
    assert r0.returncode == 0, r0.stderr[-300:]
    r = hasten("train", *HF_GPT, "trainer.load_path=bert", "trainer.run_dir=R", cwd=d)
    ok, got = one_error(r)
    return ok and "0 of this model's" in r.stderr, got


@probe("4.7 a truncated safetensors file; a pytorch_model.bin torch's weights-only loading refuses; an artifact whose "
       "metadata nests 100k '['", "hasten's one line each, never the other library's advice nor 'RecursionError'")
def p4_hostile_files(d: Path):
    _corpus(d / "c.jsonl")
    r0 = python("""
        import pathlib, shutil, torch, transformers
        m = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=300, n_layer=1, n_embd=32, n_head=2,
                                         n_positions=32))
        m.save_pretrained("trunc")
        st = next(pathlib.Path("trunc").glob("*.safetensors"))
        st.write_bytes(st.read_bytes()[:7])
        pathlib.Path("pickled").mkdir()
        shutil.copy("trunc/config.json", "pickled/config.json")
        torch.save({"w": pathlib.Path("x")}, "pickled/pytorch_model.bin")
        from hasten.compress.artifact import FORMAT
        torch.save({"format": FORMAT, "meta": "[" * 100000 + "]" * 100000, "weights": {}}, "nested.pt")
    """, d)
    assert r0.returncode == 0, r0.stderr[-300:]
    r1 = hasten("train", *HF_GPT, "trainer.load_path=trunc", "trainer.run_dir=R1", cwd=d)
    r2 = hasten("train", *HF_GPT, "trainer.load_path=pickled", "trainer.run_dir=R2", cwd=d)
    r3 = hasten("eval", "nested.pt", cwd=d)
    (ok1, g1), (ok2, g2), (ok3, g3) = one_error(r1), one_error(r2), one_error(r3)
    ok = (ok1 and ok2 and ok3 and "SafetensorError" not in r1.stderr and "weights_only" not in r2.stderr
          and "RecursionError" not in r3.stderr and "nested deeper" in r3.stderr)
    return ok, f"{g1[:70]}; {g2[:70]}; {g3[:70]}"


@probe("4.8 `hasten compress` of a run still training (a checkpoint every 2 batches, keep_last=1), 4 tries",
       "each try compresses the checkpoint it read, or says in one line the run is still writing")
def p4_compress_live(d: Path):
    proc = popen("train", "tiny.yaml", "trainer.max_duration=100000ba", "trainer.save_interval=2ba",
                 "trainer.keep_last=1", "trainer.eval_interval=100000ba", "trainer.run_dir=L", "--no-progress", cwd=d)
    got, good = [], 0
    try:
        wait_for_step(d / "L", 4, proc)
        for i in range(4):
            r = hasten("compress", "L", "--prune", f"0.{3 + i}", "--no-latency", cwd=d)
            if r.returncode == 0:
                good += 1
                got.append("compressed")
            else:
                ok, g = one_error(r)
                good += ok and "still writing" in r.stderr
                got.append(g[:80])
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=120)
    return good == 4, "; ".join(got)


@probe("4.9 trainer.memory_limit=64 (nothing fits), with and without microbatch=auto",
       "one line each saying what the limit allows and what was needed")
def p4_memory_limit(d: Path):
    r1 = hasten("train", "tiny.yaml", "trainer.memory_limit=64", "trainer.run_dir=M1", cwd=d)
    r2 = hasten("train", "tiny.yaml", "trainer.memory_limit=64", "trainer.microbatch=auto", "trainer.run_dir=M2", cwd=d)
    (ok1, g1), (ok2, g2) = one_error(r1), one_error(r2)
    ok = ok1 and ok2 and all("allows 64 bytes" in r.stderr and "report it" not in r.stderr for r in (r1, r2))
    return ok, f"{g1[:90]}; {g2[:90]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the probes whose name contains this")
    ap.add_argument("--name", default="fault_injection")
    args = ap.parse_args()
    commit, dirty = git_commit(), tree_dirty(REPO)
    rows = []
    for name, expected, fn in PROBES:
        if args.only and args.only not in name:
            continue
        with tempfile.TemporaryDirectory(prefix="hasten-probe-") as tmp:
            d = Path(tmp)
            (d / "tiny.yaml").write_text(TINY)
            t0 = time.perf_counter()
            try:
                ok, got = fn(d)
            except Exception as e:   # a probe that breaks is a failed probe, with the reason
                ok, got = False, f"probe error: {type(e).__name__}: {e}"[:200]
            for where in {str(d.resolve()), str(d)}:   # the results name no folder of the machine that ran them
                got = got.replace(where, "<probe>")
            status = "not run" if ok is NOT_RUN else "ok" if ok else "FAIL"
            rows.append({"probe": name, "expected": expected, "got": got, "ok": ok is not NOT_RUN and bool(ok),
                         "status": status, "seconds": round(time.perf_counter() - t0, 1)})
        print(f"{status:<7} {name}: {got}", flush=True)
    passed = sum(r["status"] == "ok" for r in rows)
    not_run = sum(r["status"] == "not run" for r in rows)
    ran = len(rows) - not_run
    code = f"commit {commit}" + (" with uncommitted changes: not a record of that commit" if dirty else "")
    md = [f"# Fault injection: {passed}/{ran} probes as promised" + (f", {not_run} not run" if not_run else ""), "",
          f"Run at {code}. A probe passes only when what it provokes was observed to happen and hasten then did as "
          "promised; one whose situation could not be made here is 'not run', counted apart.", "",
          "| probe | expected | got | ok |", "|---|---|---|---|"]
    md += [f"| {r['probe']} | {r['expected']} | {r['got'].replace('|', '/')} | "
           f"{ {'ok': 'yes', 'FAIL': '**no**', 'not run': 'not run'}[r['status']] } |" for r in rows]
    write_results(args.name, {"probes": rows, "passed": passed, "not_run": not_run, "total": len(rows)}, "\n".join(md))
    print(f"{passed}/{ran} probes as promised" + (f", {not_run} not run" if not_run else ""))
    return 0 if passed == ran else 1


if __name__ == "__main__":
    sys.exit(main())
