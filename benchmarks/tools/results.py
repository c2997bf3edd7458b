"""The results record: where each measurement lies, and its index.

Layout (docs/results/README.md says it for readers):
- `benchmarks/results/<subject>/<date>-<machine>-<name>/`: a result's data, what tools read:
  `result.json` (a benchmark script's record) or `runs.jsonl` (`hasten bench`'s runs, with
  `peer.jsonl` beside it when a peer was run), `tune.json` and `tuned.yaml` (`hasten tune`),
  the plots the guides show, and `logs.jsonl.gz`: every per-run log of the result, one JSON
  object a line ({"file", "run", "line"});
- `docs/results/<subject>/<date>-<machine>-<name>.md`: its report, what people read;
- `benchmarks/results/index.json`: one entry a result: id, subject, date, machine, name, data
  folder, report, command, commit, status (`current`, or `superseded` with `superseded_by`),
  and `quoted_in` (the README and guides that link to it).

`date` is the day of the commit that measured it, `machine` a short name of the CPU kind and
its speed flags or of the GPU. A result is superseded by a later one of the same subject,
machine and name (an attempt suffix -2, -v3, -reanalysed... aside); the latest is current.

    python -m benchmarks.tools.results check      # the index matches the folders (the tests run it)
    python -m benchmarks.tools.results rebuild    # statuses and quotes recomputed, written
    python -m benchmarks.tools.results archive benchmarks/results/<subject>/<id>   # a finished result:
        # its logs/ archived, its report moved to docs/results, derived files (report.json, plots) dropped
"""
from __future__ import annotations

import argparse
import datetime
import gzip
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
ATTEMPT = re.compile(r"-(\d+|v\d+|call\d+|reanalysed|fine|quiet)$")
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


def _stem(name: str) -> str:
    while ATTEMPT.search(name):
        name = ATTEMPT.sub("", name)
    return name


def _attempt(name: str) -> int:
    m = re.search(r"-(\d+)$", name)
    return int(m.group(1)) if m else 1


def texts() -> list[Path]:
    """The pages that quote results: the README and the guides (the results record itself aside)."""
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md"] + [
        p for p in sorted((ROOT / "docs").rglob("*.md")) if REPORTS not in p.parents]


def quotes() -> dict[str, list[str]]:
    """result id -> the pages whose links reach its data folder or its report."""
    out: dict[str, list[str]] = {}
    for page in texts():
        for m in MD_LINK.finditer(page.read_text()):
            target = m.group(1).split("#")[0]
            if re.match(r"^[a-z]+://", target) or not target:
                continue
            p = Path(os.path.normpath(page.parent / target))
            for base in (RESULTS, REPORTS):
                try:
                    rel = p.relative_to(base)
                except ValueError:
                    continue
                parts = rel.parts
                if len(parts) >= 2:
                    rid = f"{parts[0]}/{Path(parts[1]).stem if base == REPORTS else parts[1]}"
                    out.setdefault(rid, [])
                    page_rel = str(page.relative_to(ROOT))
                    if page_rel not in out[rid]:
                        out[rid].append(page_rel)
    return out


def rebuild(entries: list[dict]) -> list[dict]:
    """The entries with status, superseded_by and quoted_in recomputed from the folders and pages."""
    quoted = quotes()
    groups: dict[tuple, list[dict]] = {}
    for e in entries:
        groups.setdefault((e["subject"], e["machine"], _stem(e["name"])), []).append(e)
    for group in groups.values():
        group.sort(key=lambda e: (e["date"], _attempt(e["name"]), e["name"]))
        latest = group[-1]
        for e in group:
            e["status"] = "current" if e is latest else "superseded"
            e["superseded_by"] = None if e is latest else latest["id"]
    for e in entries:
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
            "commit": commit, "status": "current", "superseded_by": None, "quoted_in": []}


def register(folder: Path, command: "str | None" = None, commit: "str | None" = None) -> dict:
    """Add (or refresh) the entry of `folder` in the index and recompute the statuses."""
    entries = [e for e in load() if e["data"] != str(folder.relative_to(ROOT))]
    new = entry_for(folder, command, commit)
    entries.append(new)
    save(rebuild(entries))
    return new


def archive(folder: Path) -> None:
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
    register(folder, command, commit)


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
    fresh = {e["id"]: (e["status"], e["superseded_by"], e["quoted_in"]) for e in rebuild(json.loads(json.dumps(entries)))}
    for e in entries:
        if fresh[e["id"]] != (e["status"], e["superseded_by"], e["quoted_in"]):
            out.append(f"{e['id']}: status or quotes out of date (python -m benchmarks.tools.results rebuild)")
    n = sum(1 for p in RESULTS.rglob("*") if p.is_file())
    if n > MAX_FILES:
        out.append(f"benchmarks/results holds {n} files, more than {MAX_FILES}: archive logs, drop derived files")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("check", "rebuild", "archive"))
    ap.add_argument("folder", nargs="?")
    args = ap.parse_args(argv)
    if args.action == "archive":
        archive(Path(args.folder))
    elif args.action == "rebuild":
        save(rebuild(load()))
    found = problems()
    print("\n".join(found) or f"index: {len(load())} results, as the folders are")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
