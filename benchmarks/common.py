"""Shared bits of the benchmark scripts: machine description and result files."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"


def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"python": sys.version.split()[0], "torch": torch.__version__, "cpu": cpu,
            "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "loadavg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except OSError:
        return None


def write_results(name: str, data: dict, markdown: str) -> tuple[Path, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "command": "python " + " ".join(sys.argv), "commit": git_commit(),
            "machine": machine(), **data}
    j, m = RESULTS / f"{name}.json", RESULTS / f"{name}.md"
    j.write_text(json.dumps(data, indent=2) + "\n")
    m.write_text(markdown.rstrip() + f"\n\nCommand: `{data['command']}` (commit {data['commit']}); "
                 f"machine: {data['machine']['cpu']}, {data['machine']['cores']} cores, torch {data['machine']['torch']}.\n")
    return j, m
