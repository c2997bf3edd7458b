"""The layering, checked: every module imports in a fresh interpreter, no import cycle among
hasten's modules, few function-level imports (each saying why), and registries that cannot
drift from their modules."""
import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import hasten
from hasten import algorithms
from hasten.core import Algorithm
from hasten.registry import ALGORITHMS, TASKS

from helpers.layers import layer_of, render

SRC = Path(hasten.__file__).parent
MAX_FUNCTION_LEVEL_IMPORTS = 15


def _modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path):
    """(target module, line, inside a function, the source line) for every import of hasten's
    own modules in `name`."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    source = path.read_text().splitlines()
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                if mod == "hasten" or mod.startswith("hasten."):
                    for alias in child.names:
                        found.append((mod, alias.name, child.lineno, inside, source[child.lineno - 1]))
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name == "hasten" or alias.name.startswith("hasten."):
                        found.append((alias.name, None, child.lineno, inside, source[child.lineno - 1]))
            visit(child, inside)
    visit(ast.parse(path.read_text()), False)
    return found


def _target(mod: str, attr: str | None, modules: dict) -> str | None:
    """The module an import depends on: `from pkg import sub` is the module pkg.sub; a name
    re-exported by a package is the module that defines it; a package's plain attribute
    (`from . import __version__`) counts as no edge."""
    if attr and f"{mod}.{attr}" in modules:
        return f"{mod}.{attr}"
    if modules.get(mod) is None or modules[mod].name != "__init__.py":
        return mod
    obj = getattr(importlib.import_module(mod), attr, None) if attr else None
    defined = getattr(obj, "__module__", None)
    return defined if defined in modules and defined != mod else None


def test_every_module_imports_in_a_fresh_interpreter():
    names = [m.name for m in pkgutil.walk_packages(hasten.__path__, "hasten.")]
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_no_import_cycle_among_hasten_modules():
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        if path.name == "__init__.py":
            continue   # a package's own re-exports are not dependencies of its modules
        for mod, attr, _, _, _ in _imports(name, path):
            target = _target(mod, attr, modules)
            if target and target != name and target in graph:
                graph[name].add(target)
    # Tarjan's strongly connected components: any with more than one module is a cycle
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    assert not cycles, f"import cycles among hasten's modules: {cycles}"


def test_function_level_imports_are_few_and_say_why():
    lazy = [(name, line, text.strip()) for name, path in _modules().items()
            for _, _, line, inside, text in _imports(name, path) if inside]
    assert len(lazy) <= MAX_FUNCTION_LEVEL_IMPORTS, lazy
    unexplained = [x for x in lazy if "#" not in x[2]]
    assert not unexplained, f"a function-level import keeps an optional extra or a heavy module off start-up; say which: {unexplained}"


def test_every_registry_name_is_its_module_name():
    assert ALGORITHMS is algorithms.REGISTRY
    for name, cls in ALGORITHMS.items():
        assert cls.__module__ == f"hasten.algorithms.{name}", (name, cls.__module__)
        assert cls.registry_name == name


def test_every_exported_algorithm_is_registered_and_every_module_declares_its_exports():
    for module in algorithms.MODULES:
        assert isinstance(module.__all__, list) and module.__all__, module.__name__
        for n in module.__all__:
            obj = getattr(module, n)
            if isinstance(obj, type) and issubclass(obj, Algorithm):
                assert ALGORITHMS.get(getattr(obj, "registry_name", None)) is obj, f"{module.__name__}.{n} is not registered"


def test_functional_exports_are_derived_from_the_method_modules():
    import hasten.functional as hf
    for module in algorithms.MODULES:
        for n, obj in algorithms.functional_forms(module).items():
            assert getattr(hf, n) is obj, n


def test_every_task_is_registered_once_and_says_how_it_is_judged():
    specs = set(TASKS.values())
    for spec in specs:
        assert TASKS[spec.name] is spec
        assert spec.quality.direction in ("max", "min") and "/" in spec.quality.metric


def test_no_module_is_kept_for_an_old_import_path():
    """hasten was never released: a name that moved has one home, and the old path is gone."""
    for old in ("hasten.utils", "hasten.fsdp", "hasten.checkpoint_sharded", "hasten.compress.gradual",
                "hasten.compress.pruning", "hasten.algorithms.grad_clipping", "hasten.algorithms.frozen_bn",
                "hasten.algorithms.chunked_ce", "hasten.assemble", "hasten.distributed.prepare"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


def _type_checking_lines(path: Path) -> set[int]:
    """Lines inside `if TYPE_CHECKING:` blocks (imports for annotations only: no edge at run time)."""
    lines = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            lines |= {n.lineno for n in ast.walk(node) if hasattr(n, "lineno")}
    return lines


def test_every_module_is_on_a_layer_and_no_module_level_import_runs_up():
    modules = _modules()
    assert not [m for m in modules if layer_of(m) < 0], "modules on no layer (tests/helpers/layers.py)"
    up = []
    for name, path in modules.items():
        skip = _type_checking_lines(path)
        for mod, attr, line, inside, text in _imports(name, path):
            target = _target(mod, attr, modules)
            if inside or line in skip or target in (None, name):
                continue
            if layer_of(target) > layer_of(name):
                up.append(f"{name} (layer {layer_of(name) + 1}) imports {target} (layer {layer_of(target) + 1}): {text.strip()}")
    assert not up, "\n".join(up)


def test_the_architecture_page_shows_the_layer_map():
    page = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    assert render() in page, "docs/architecture.md's Layers list differs from tests/helpers/layers.py: paste render()"


def test_no_package_face_is_over_40_lines():
    """A package's __init__.py says what the package holds and re-exports; the code lives in its modules."""
    long = {str(p.relative_to(SRC)): len(p.read_text().splitlines()) for p in SRC.rglob("__init__.py")
            if len(p.read_text().splitlines()) > 40}
    assert not long, long
