"""What encoding a character corpus costs: time and peak memory, per-character lookup against
hasten's `CharTokenizer.encode` (int64, and the compact dtype the char task keeps).

Each way in a fresh process, the ways alternating for `--repeats` rounds, on Tiny Shakespeare
repeated `--copies` times (by default about 50 MB of text). The
per-character lookup is what the encoder did before (a Python list of ids, then a tensor);
peak memory is the process's maximum resident memory above what it held before encoding.

    python -m benchmarks.probes.char_encode_cost [--copies 45] [--repeats 3] [--name char_encode_cost]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

WAYS = {
    "per-character lookup (before), int64": "lookup",
    "CharTokenizer.encode, int64": "long",
    "CharTokenizer.encode, compact dtype (what the char task keeps)": "compact",
}

CHILD = r"""
import json, resource, sys, time, torch
from hasten.data.text import CharTokenizer, compact_dtype, load_text
text = load_text() * int(sys.argv[2])
tok = CharTokenizer(text)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if sys.argv[1] == "lookup":
    ids = torch.tensor([tok.stoi[c] for c in text], dtype=torch.long)
elif sys.argv[1] == "long":
    ids = tok.encode(text)
else:
    ids = tok.encode(text, compact_dtype(tok.vocab_size))
s = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"chars": len(text), "s": s, "peak_mb": (peak - before) / 1024,
                  "held_mb": ids.numel() * ids.element_size() / 2**20, "dtype": str(ids.dtype)}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=45, help="Tiny Shakespeare repeated this many times")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default="char_encode_cost")
    a = ap.parse_args(argv)
    if a.copies < 1 or a.repeats < 1:
        sys.exit("char_encode_cost: --copies and --repeats must be at least 1")
    from benchmarks.tools.common import mean_sd, write_results
    runs = {label: [] for label in WAYS}
    for _ in range(a.repeats):   # the ways alternate
        for label, way in WAYS.items():
            out = subprocess.run([sys.executable, "-c", CHILD, way, str(a.copies)], capture_output=True, text=True,
                                 check=True).stdout
            runs[label].append(json.loads(out.strip().splitlines()[-1]))

    chars = runs[next(iter(WAYS))][0]["chars"]
    rows = [f"| {label} | {r[0]['dtype']} | {mean_sd([x['s'] for x in r], 2)} | {mean_sd([x['peak_mb'] for x in r], 0)} | "
            f"{r[0]['held_mb']:.0f} |" for label, r in runs.items()]
    md = (f"# Encoding a character corpus: {chars / 1e6:.1f} M characters\n\n"
          f"Tiny Shakespeare x {a.copies}; each way a fresh process, {a.repeats} rounds alternating.\n\n"
          "| way | dtype | seconds | peak memory added, MB | tokens held, MB |\n|---|---|---|---|---|\n"
          + "\n".join(rows) + "\n")
    write_results(a.name, {"copies": a.copies, "repeats": a.repeats, "runs": runs}, md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
