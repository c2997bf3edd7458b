"""The results record: where each measurement lies, and its index.

Layout (docs/results/README.md says it for readers):
- `benchmarks/results/<subject>/<date>-<machine>-<name>/`: a result's data, what tools read:
  `result.json` (a benchmark script's record) or `runs.jsonl` (`hasten bench`'s runs, with
  `peer.jsonl` beside it when a peer was run), `tune.json` and `tuned.yaml` (`hasten tune`),
  the plots the guides show, and `logs.jsonl.gz`: every per-run log of the result, one JSON
  object a line ({"file", "run", "line"});
- `docs/results/<subject>/<date>-<machine>-<name>.md`: its report, what people read;
- `benchmarks/results/index.json`: one entry a result: id, subject, date, machine, name, data
  folder, report, command, commit, `supersedes` (the results this one replaces, written when it
  is filed), `code` (whether the source hash its runs recorded is that of the commit they
  name), status and `quoted_in` (the README and guides that link to it).

`date` is the day of the commit that measured it, `machine` a short name of the CPU kind and
its speed flags or of the GPU. Status: `superseded` (with `superseded_by`) when a later result's
`supersedes` names it, never inferred from names; else `unattributed` when its runs recorded no
commit, `uncommitted code` when their source hash is not that of the commit they name, and
`assembled by hand` when its entry says `"made": "by hand"` (written from printed lines, not by
the harness that ran it), and `current` otherwise. Pages cite current results only, or say
beside the link what the result is (tests/test_evidence.py).

    python -m benchmarks.tools.results check      # the index matches the folders (the tests run it)
    python -m benchmarks.tools.results rebuild    # statuses and quotes recomputed, written
    python -m benchmarks.tools.results archive benchmarks/results/<subject>/<id> [--supersedes ID ...]
        # a finished result: its logs/ archived, its report moved to docs/results, derived files
        # (report.json, plots) dropped, what it replaces written in its entry
"""
from __future__ import annotations

import argparse
import datetime
import functools
import gzip
import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
REPORTS = ROOT / "docs" / "results"
INDEX = RESULTS / "index.json"
MAX_FILES = 600
SUBJECTS = ("vision", "language-models", "methods", "compression", "distributed", "systems", "tune", "trainers",
            "reliability")
DERIVED = ("report.json", "report.png", "ladder.json", "ladder.png", "tune.png", "lr.png", ".hasten-outputs.json", ".hasten.lock")
SCRATCH = (".hasten.lock", ".tmp", ".hasten-outputs.json")   # what a run leaves that is never evidence
FOLDER = re.compile(r"^(\d{4}-\d{2}-\d{2})-(h200|h100|a100|gpu|xeon-amx|xeon-bf16|xeon-avx512|xeon-capped-avx2|"
                    r"epyc-bf16|epyc-avx512|epyc-avx2|epyc-capped-avx2|cpu-avx2|epyc|xeon|unknown-machine)-(.+)$")
MD_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def short_machine(identity: dict) -> str:
    """A machine's short name from hasten.provenance.machine_identity() (or a bench record's machine)."""
    gpu = identity.get("gpu") or identity.get("cuda")
    if gpu:
        return next((g.lower() for g in ("H200", "H100", "A100") if g in str(gpu)), "gpu")
    cpu, flags = str(identity.get("cpu", "")), set(identity.get("flags") or identity.get("cpu_features") or ())
    epyc = "EPYC" in cpu or "AMD" in cpu
    if any("AVX2" in str(v).upper() for v in (identity.get("kernel_caps") or {}).values()):
        return "epyc-capped-avx2" if epyc else "xeon-capped-avx2"
    if "amx_bf16" in flags:
        return "xeon-amx"
    if "avx512_bf16" in flags:
        return "epyc-bf16" if epyc else "xeon-bf16"
    if "avx512f" in flags:
        return "epyc-avx512" if epyc else "xeon-avx512"
    return "epyc-avx2" if epyc else "cpu-avx2"


def subject_of(name: str) -> str:
    """The subject a result belongs to, from its name (a script passes its own where it knows better)."""
    n = name.lower()
    rules = (("tune", ("tune", "tuned-vs-written")), ("trainers", ("vs-trainers", "vs_trainers")),
             ("reliability", ("fault",)),
             ("compression", ("compress", "budget-study", "prun", "quant", "int8", "widths")),
             ("distributed", ("ddp", "fsdp", "two_cores", "two-cores", "activation-checkpointing")),
             ("methods", ("cards-", "infobatch", "data-pruning", "ema_batchnorm", "tta_cost", "self-and-delay")),
             ("systems", ("overhead", "trainer_instructions", "trainer_opcodes", "host_allocator", "vision_systems",
                          "compile-optimizer", "profile", "session-", "whiten_fit")),
             ("language-models", ("shakespeare", "prose", "lm-", "gpt", "nanogpt", "modded", "rope", "char_encode",
                                  "float8", "bert", "spam", "muon_ns")))
    return next((subject for subject, keys in rules if any(k in n for k in keys)), "vision")


def place(subject: str, name: str, machine: str) -> tuple[Path, Path]:
    """(data folder, report) for a result named `name` measured on `machine`: the folder of an
    unfinished result of that name and machine when there is one (a harness continues it),
    else a new one dated today."""
    root = RESULTS / subject
    found = sorted(root.glob(f"*-{machine}-{name}")) if root.is_dir() else []
    folder = found[-1] if found else root / f"{datetime.date.today().isoformat()}-{machine}-{name}"
    return folder, REPORTS / subject / f"{folder.name}.md"


# ---------------------------------------------------------------------------- the index
def load() -> list[dict]:
    return json.loads(INDEX.read_text()) if INDEX.exists() else []


def save(entries: list[dict]) -> None:
    INDEX.write_text(json.dumps(sorted(entries, key=lambda e: e["id"]), indent=1) + "\n")


def recorded_code(folder: Path) -> list[dict]:
    """The code versions (provenance.code_version) the runs of a result recorded, one per distinct
    version: a script's result.json, bench's runs, a tune's record."""
    found = []
    if (folder / "result.json").exists():
        data = json.loads((folder / "result.json").read_text())
        found.append(data.get("code") or {"commit": data.get("commit")})
    for name in ("runs.jsonl", "peer.jsonl"):
        if (folder / name).exists():
            for ln in (folder / name).read_text().splitlines():
                try:
                    r = json.loads(ln)
                except ValueError:
                    continue
                code = (r.get("final") or {}).get("code")
                if isinstance(code, dict):
                    found.append(code)
    if (folder / "tune.json").exists():
        data = json.loads((folder / "tune.json").read_text())
        if isinstance(data.get("code"), dict):
            found.append(data["code"])
    out = []
    for c in found:
        c = {k: c.get(k) for k in ("commit", "source_sha256", "dirty")}
        if c not in out:
            out.append(c)
    return out


@functools.cache
def source_hash_at(commit: str) -> "str | None":
    """provenance.source_hash of hasten's source as `commit` holds it (None: git does not have it)."""
    from hasten.provenance import git_output
    listing = git_output("ls-tree", "-r", "--format=%(objectname) %(path)", commit, "--", "src/hasten", cwd=ROOT)
    if listing is None:
        return None
    files = sorted((tuple(Path(path).relative_to("src/hasten").parts), obj) for obj, path in
                   (ln.split(" ", 1) for ln in listing.splitlines() if ln.strip())
                   if path.endswith((".py", ".yaml")) and "__pycache__" not in path)
    import subprocess
    batch = subprocess.run(["git", "cat-file", "--batch"], cwd=ROOT, input="".join(f"{o}\n" for _, o in files).encode(),
                           capture_output=True, timeout=60).stdout
    h, at = hashlib.sha256(), 0
    for parts, _ in files:
        header_end = batch.index(b"\n", at)
        size = int(batch[at:header_end].split()[2])
        body = batch[header_end + 1:header_end + 1 + size]
        at = header_end + 1 + size + 1
        h.update("/".join(parts).encode() + b"\0" + body + b"\0")
    return h.hexdigest()


def code_verdict(folder: Path) -> "str | None":
    """'matches its commit', 'uncommitted code' (a run's source hash is not its commit's, or it
    says its tree was dirty), 'no commit recorded', or None where git cannot tell (a shallow clone)."""
    codes = recorded_code(folder)
    if not codes or not all(c.get("commit") for c in codes):
        return "no commit recorded"
    verdict = "matches its commit"
    for c in codes:
        if c.get("dirty"):
            return "uncommitted code"
        if c.get("source_sha256"):
            at = source_hash_at(c["commit"])
            if at is None:
                verdict = None
            elif at != c["source_sha256"]:
                return "uncommitted code"
    return verdict


def texts() -> list[Path]:
    """The pages that quote results: the README and the guides (the results record itself aside)."""
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md"] + [
        p for p in sorted((ROOT / "docs").rglob("*.md")) if REPORTS not in p.parents]


def quotes() -> dict[str, list[str]]:
    """result id -> the pages whose links reach its data folder or its report."""
    out: dict[str, list[str]] = {}
    for page in texts():
        for m in MD_LINK.finditer(page.read_text()):
            rid = _cited(page, m.group(1))
            if rid is not None:
                out.setdefault(rid, [])
                page_rel = str(page.relative_to(ROOT))
                if page_rel not in out[rid]:
                    out[rid].append(page_rel)
    return out


STATUS_WORDS = {"superseded": "superseded", "uncommitted code": "uncommitted code",
                "unattributed": "no commit recorded", "assembled by hand": "assembled by hand"}
"""What a page writes beside a link to a result that is not current (on the link's line)."""


def _cited(page: Path, target: str) -> "str | None":
    """The result id a link from `page` to `target` reaches (its data folder or its report), or None."""
    target = target.split("#")[0]
    if not target or re.match(r"^[a-z]+://", target):
        return None
    p = Path(os.path.normpath(page.parent / target))
    for base in (RESULTS, REPORTS):
        try:
            parts = p.relative_to(base).parts
        except ValueError:
            continue
        if len(parts) >= 2:
            return f"{parts[0]}/{Path(parts[1]).stem if base == REPORTS else parts[1]}"
    return None


def unlabelled_citations(entries: list[dict]) -> list[tuple[str, int, str]]:
    """(page, line, result id) of every link to a result that is not current on a line that does
    not say what it is (STATUS_WORDS): a page cites current results, or labels the others."""
    status = {e["id"]: e["status"] for e in entries}
    out = []
    for page in texts():
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for m in MD_LINK.finditer(line):
                rid = _cited(page, m.group(1))
                if rid in status and status[rid] != "current" and STATUS_WORDS[status[rid]] not in line:
                    out.append((str(page.relative_to(ROOT)), n, rid))
    return out


def rebuild(entries: list[dict]) -> list[dict]:
    """The entries with status, superseded_by and quoted_in recomputed from what each entry
    records (`supersedes`, `commit`, `code`) and from the pages' links."""
    quoted = quotes()
    replaced = {old: e["id"] for e in entries for old in e.get("supersedes") or []}
    for e in entries:
        e.setdefault("supersedes", [])
        e["superseded_by"] = replaced.get(e["id"])
        if e["superseded_by"]:
            e["status"] = "superseded"
        elif e.get("made") == "by hand":   # not written by the harness that ran it
            e["status"] = "assembled by hand"
        elif not e.get("commit"):
            e["status"] = "unattributed"
        elif e.get("code") == "uncommitted code":
            e["status"] = "uncommitted code"
        else:
            e["status"] = "current"
        e["quoted_in"] = sorted(quoted.get(e["id"], []))
    return entries


def entry_for(folder: Path, command: "str | None" = None, commit: "str | None" = None) -> dict:
    """A new index entry for the data folder `folder` (its name gives date, machine and name)."""
    m = FOLDER.match(folder.name)
    if not m:
        raise ValueError(f"{folder.name}: not <date>-<machine>-<name>")
    report = REPORTS / folder.parent.name / f"{folder.name}.md"
    return {"id": f"{folder.parent.name}/{folder.name}", "subject": folder.parent.name, "date": m.group(1),
            "machine": m.group(2), "name": m.group(3), "data": str(folder.relative_to(ROOT)),
            "report": str(report.relative_to(ROOT)) if report.exists() else None, "command": command,
            "commit": commit, "supersedes": [], "code": code_verdict(folder), "status": "current",
            "superseded_by": None, "quoted_in": []}


def register(folder: Path, command: "str | None" = None, commit: "str | None" = None,
             supersedes: "list[str] | None" = None) -> dict:
    """Add (or refresh) the entry of `folder` in the index and recompute the statuses;
    `supersedes` names the results it replaces (kept from the earlier entry when not given)."""
    rel = str(folder.relative_to(ROOT))
    before = next((e for e in load() if e["data"] == rel), None)
    entries = [e for e in load() if e["data"] != rel]
    known = {e["id"] for e in entries}
    new = entry_for(folder, command, commit)
    new["supersedes"] = list(supersedes if supersedes is not None else (before or {}).get("supersedes") or [])
    if (before or {}).get("made"):
        new["made"] = before["made"]
    unknown = [s for s in new["supersedes"] if s not in known]
    if unknown:
        raise ValueError(f"--supersedes {', '.join(unknown)}: no such result in the index")
    entries.append(new)
    save(rebuild(entries))
    return new


def archive(folder: Path, supersedes: "list[str] | None" = None) -> None:
    """A finished result in its final form: logs/ (and loose run logs) into logs.jsonl.gz, its
    report into docs/results, derived files dropped, its entry registered."""
    folder = Path(folder).resolve()
    records = []
    for p in sorted(folder.rglob("*")):
        if p.is_file() and ("logs" in p.relative_to(folder).parts or p.suffix in (".log", ".txt")):
            inner = p.relative_to(folder)
            records += [{"file": inner.as_posix(), "run": p.stem, "line": ln}
                        for ln in p.read_text(errors="replace").splitlines()]
            p.unlink()
    if records:
        with gzip.open(folder / "logs.jsonl.gz", "at") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    if (folder / "logs").is_dir():
        shutil.rmtree(folder / "logs")
    command = None
    if (folder / "report.json").exists():
        command = json.loads((folder / "report.json").read_text()).get("command")
    for name in ("report.md", "ladder.md", "tune.md"):
        if (folder / name).exists():
            report = REPORTS / folder.parent.name / f"{folder.name}.md"
            report.parent.mkdir(parents=True, exist_ok=True)
            text = re.sub(r"!\[[^\]]*\]\((report|ladder|tune)\.png\)\n?", "", (folder / name).read_text())
            if (folder / "result.json").exists() and report.exists():
                # a comparison script wrote the report; hasten bench's own report of its runs goes under it
                text = re.sub(r"^(#+) ", r"#\1 ", text, flags=re.M)
                text = report.read_text().rstrip() + "\n\n## hasten bench's report of hasten's runs\n\n" + text
            report.write_text(text)
            (folder / name).unlink()
            break
    for name in DERIVED:   # at any depth: a tune's method stage keeps its bench runs in methods/
        for p in folder.rglob(name):
            p.unlink()
    for p in sorted(folder.rglob("*"), reverse=True):   # folders the archived logs leave empty
        if p.is_dir() and not any(p.iterdir()):
            p.rmdir()
    commit = None
    runs = folder / "runs.jsonl"
    if runs.exists():
        for ln in runs.read_text().splitlines():
            r = json.loads(ln)
            commit = commit or ((r.get("final") or {}).get("code") or {}).get("commit")
    register(folder, command, commit, supersedes)


def problems() -> list[str]:
    """What keeps the index from matching the folders (empty when it does)."""
    out, entries = [], load()
    by_data = {e["data"]: e for e in entries}
    folders = [p for s in RESULTS.iterdir() if s.is_dir() for p in s.iterdir() if p.is_dir()]
    for f in folders:
        rel = str(f.relative_to(ROOT))
        if rel not in by_data:
            out.append(f"{rel}: a result folder the index does not list")
        if (f / "logs").exists():
            out.append(f"{rel}: logs/ not archived (python -m benchmarks.tools.results archive {rel})")
        if not FOLDER.match(f.name) or f.parent.name not in SUBJECTS:
            out.append(f"{rel}: not <subject>/<date>-<machine>-<name>")
    listed = {str(f.relative_to(ROOT)) for f in folders}
    for e in entries:
        if e["data"] not in listed:
            out.append(f"{e['id']}: listed, but {e['data']} is not there")
        if e["report"] and not (ROOT / e["report"]).exists():
            out.append(f"{e['id']}: its report {e['report']} is not there")
    ids = {e["id"] for e in entries}
    by_id = {e["id"]: e for e in entries}
    for e in entries:
        for old in e.get("supersedes") or []:
            if old not in ids:
                out.append(f"{e['id']}: supersedes {old}, which the index does not list")
    fresh = {e["id"]: (e["status"], e["superseded_by"], e["quoted_in"]) for e in rebuild(json.loads(json.dumps(entries)))}
    for e in entries:
        if fresh[e["id"]] != (e["status"], e["superseded_by"], e["quoted_in"]):
            out.append(f"{e['id']}: status or quotes out of date (python -m benchmarks.tools.results rebuild)")
    for page, line, rid in unlabelled_citations(entries):
        out.append(f"{page}:{line} cites {rid}, which is {by_id[rid]['status']}, without saying so: cite a current "
                   f"result, or write '{STATUS_WORDS[by_id[rid]['status']]}' beside the link")
    for p in RESULTS.rglob("*"):
        if p.is_file() and (p.name in SCRATCH or p.name.endswith(".tmp")):
            out.append(f"{p.relative_to(ROOT)}: a run's scratch file, not evidence: remove it")
    n = sum(1 for p in RESULTS.rglob("*") if p.is_file())
    if n > MAX_FILES:
        out.append(f"benchmarks/results holds {n} files, more than {MAX_FILES}: archive logs, drop derived files")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("check", "rebuild", "archive"))
    ap.add_argument("folder", nargs="?")
    ap.add_argument("--supersedes", nargs="+", metavar="ID", help="archive: the results this one replaces")
    args = ap.parse_args(argv)
    if args.action == "archive":
        archive(Path(args.folder), args.supersedes)
    elif args.action == "rebuild":
        save(rebuild(load()))
    found = problems()
    print("\n".join(found) or f"index: {len(load())} results, as the folders are")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
