"""The reference and the record, checked: every relative link resolves, the results index
matches the result folders, benchmarks/ holds its three kinds of script and nothing loose, and
the guides and the README stay references (no long measurement sections, no overlong lines, a
short headline table)."""
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "benchmarks").rglob("*.md"))


def _guides() -> list[Path]:
    """The README and the guides: docs/ without the results record."""
    return [ROOT / "README.md"] + [p for p in sorted((ROOT / "docs").rglob("*.md"))
                                   if (ROOT / "docs" / "results") not in p.parents]


def test_every_relative_link_resolves():
    broken = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            path = target.split("#")[0]
            if path and not re.match(r"^[a-z]+:", path) and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "\n".join(broken)


def _results_tool():
    spec = importlib.util.spec_from_file_location("results_tool", ROOT / "benchmarks" / "tools" / "results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_results_index_matches_the_folders():
    tool = _results_tool()
    assert tool.problems() == []
    entries = tool.load()
    assert entries and all(e["status"] in ("current", *tool.STATUS_WORDS) for e in entries)
    ids = {e["id"] for e in entries}
    assert all(e["superseded_by"] in ids for e in entries if e["status"] == "superseded")
    assert all(e["commit"] for e in entries if e["status"] == "current")   # every current result names its commit


def _scratch_record(tmp_path, tool, monkeypatch):
    """A results record of three results in a scratch tree: `a` and its attempt `a-2` (a name
    that looks like a rerun), and `b` run on uncommitted code; a guide citing them."""
    import json
    for name in ("ROOT", "RESULTS", "REPORTS", "INDEX"):
        monkeypatch.setattr(tool, name, {"ROOT": tmp_path, "RESULTS": tmp_path / "benchmarks" / "results",
                                         "REPORTS": tmp_path / "docs" / "results",
                                         "INDEX": tmp_path / "benchmarks" / "results" / "index.json"}[name])
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks" / "README.md").write_text("# b\n")
    (tmp_path / "README.md").write_text("# r\n")
    for name, dirty in (("a", False), ("a-2", False), ("b", True)):
        folder = tool.RESULTS / "vision" / f"2026-12-01-xeon-avx512-{name}"
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps({"code": {"commit": "c0ffee", "dirty": dirty}}))
        (tool.REPORTS / "vision").mkdir(parents=True, exist_ok=True)
        (tool.REPORTS / "vision" / f"{folder.name}.md").write_text("# r\n")
        tool.register(folder, "cmd", "c0ffee")
    return {e["name"]: e for e in tool.load()}


def test_supersession_is_what_a_filing_says_and_pages_label_what_is_not_current(tmp_path, monkeypatch):
    tool = _results_tool()
    entries = _scratch_record(tmp_path, tool, monkeypatch)
    assert entries["a"]["status"] == entries["a-2"]["status"] == "current"   # names infer nothing
    assert entries["b"]["status"] == "uncommitted code"
    again = tool.register(tool.ROOT / entries["a-2"]["data"], "cmd", "c0ffee", supersedes=[entries["a"]["id"]])
    assert again["supersedes"] == [entries["a"]["id"]]
    assert {e["name"]: e["status"] for e in tool.load()}["a"] == "superseded"
    guide = tmp_path / "README.md"
    link = {n: f"[record](docs/results/vision/{entries[n]['id'].split('/')[1]}.md)" for n in entries}
    guide.write_text(f"a figure ({link['b']}) and an older one ({link['a']}) and the rerun ({link['a-2']})\n")
    complaints = [p for p in tool.problems() if "without saying so" in p]
    assert len(complaints) == 2 and any("uncommitted code" in p for p in complaints) and \
        any("superseded" in p for p in complaints), complaints
    guide.write_text(f"a figure ({link['b']}, uncommitted code)\nan older one ({link['a']}, superseded)\n")
    assert not [p for p in tool.problems() if "without saying so" in p]
    (tool.ROOT / entries["a"]["data"] / ".hasten.lock").write_text("")
    assert any(".hasten.lock: a run's scratch file" in p for p in tool.problems())
    with __import__("pytest").raises(ValueError, match="no such result"):
        tool.register(tool.ROOT / entries["b"]["data"], "cmd", "c0ffee", supersedes=["vision/nothing"])


def test_benchmarks_holds_comparisons_probes_and_tools_and_imports_hasten_publicly():
    top = {p.name for p in (ROOT / "benchmarks").iterdir() if not p.name.startswith((".", "__pycache__"))}
    assert top == {"README.md", "__init__.py", "comparisons", "probes", "tools", "results"}, top
    scripts = [p for p in (ROOT / "benchmarks").rglob("*.py") if "results" not in p.parts]
    private = [f"{p.relative_to(ROOT)}: {m}" for p in scripts
               for m in re.findall(r"from hasten[\w.]* import [^\n]*\b_[a-z]\w*", p.read_text())]
    assert not private, private
    edits = [str(p.relative_to(ROOT)) for p in scripts if "sys.path.insert" in p.read_text()]
    assert not edits, edits


def test_the_guides_are_references_and_the_readme_table_is_short():
    long_lines = [f"{p.relative_to(ROOT)}:{i}" for p in _guides()
                  for i, ln in enumerate(p.read_text().splitlines(), 1) if len(ln) > 600]
    assert not long_lines, long_lines
    long_sections = []
    for page in _guides():
        if page == ROOT / "docs" / "methods" / "README.md":
            continue   # the cards' summary table, one row a method, generated from the cards
        lines = page.read_text().splitlines()
        heads = [i for i, ln in enumerate(lines) if ln.startswith("#")] + [len(lines)]
        for a, b in zip(heads, heads[1:]):
            title = lines[a].lower()
            if any(w in title for w in ("measured", "results", "against", "benchmark")) and b - a > 40:
                long_sections.append(f"{page.relative_to(ROOT)}: '{lines[a]}' ({b - a} lines)")
    assert not long_sections, long_sections
    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- headline results -->")[1].split("<!-- end headline results -->")[0]
    rows = [ln for ln in table.strip().splitlines()[2:] if ln.startswith("|")]
    assert 0 < len(rows) <= 12, len(rows)
    cells = [c for row in rows for c in row.strip("|").split("|") if len(c) > 300]
    assert not cells, cells


def test_the_gpu_script_names_only_what_exists():
    """benchmarks/tools/gpu_session.sh runs only on a lent GPU, so no run here catches a module
    or recipe that moved: its names are checked instead."""
    import importlib

    from hasten.config import available_recipes

    text = (ROOT / "benchmarks" / "tools" / "gpu_session.sh").read_text()
    modules = set(re.findall(r"python3 -m ((?:benchmarks|hasten)[\w.]*)", text))
    assert "benchmarks.comparisons.cifar10_cpu_vs_peer" in modules
    assert not [m for m in modules if importlib.util.find_spec(m) is None]
    for module, name in re.findall(r"from ((?:benchmarks|hasten)[\w.]*) import (\w+)", text):
        assert hasattr(importlib.import_module(module), name), (module, name)
    recipes = set(re.findall(r"(?:hasten (?:bench|train)|(?<![\w.])vs_peer \S+) ([a-z0-9][\w-]*)", text))
    recipes |= set(re.findall(r"\bN=([a-z0-9][\w-]*)", text))
    assert "cifar10-fast-gpu" in recipes and not recipes - set(available_recipes())
    from benchmarks.comparisons.cifar10_cpu_vs_peer import PEERS
    kinds = set(re.findall(r"(?<![\w.])vs_peer \S+ \S+ (\w+)", text, flags=re.S))
    assert {"muon", "hive"} <= kinds <= set(PEERS)
    listed = set(re.findall(r"^#   ([a-z0-9-]+)[ ,]", text, flags=re.M)) - {"bash", "CALL"}
    cases = set(re.findall(r"^  ([a-z0-9|-]+)\)", text, flags=re.M))
    cases = {c for case in cases for c in case.split("|")}
    assert listed <= cases, listed - cases
