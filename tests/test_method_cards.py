"""Every registered algorithm has a card, a functional form in hasten.functional, and a
measured-effect table in its card."""
import re
from pathlib import Path

import pytest

import hasten.functional as hf
from hasten.algorithms import INSTRUMENTS, REGISTRY

DOCS = Path(__file__).resolve().parents[1] / "docs" / "methods"
METHODS = sorted(set(REGISTRY) - INSTRUMENTS)
_TABLE = re.compile(r"^\|.*\|\s*\n\|[-| :]+\|\s*$", re.M)


def _measured_section(name: str) -> str:
    text = (DOCS / f"{name}.md").read_text()
    i = text.find("**Measured effect")
    assert i >= 0, f"docs/methods/{name}.md has no '**Measured effect' section"
    return text[i:]


@pytest.mark.parametrize("name", METHODS)
def test_every_method_has_a_card_and_a_functional_form(name):
    assert (DOCS / f"{name}.md").is_file(), f"docs/methods/{name}.md is missing"
    module = __import__(REGISTRY[name].__module__, fromlist=["_"])
    exported = {id(getattr(hf, n)) for n in hf.__all__}
    assert any(id(v) in exported for v in vars(module).values()), \
        f"{name}: no functional form of its module is exported from hasten.functional"


@pytest.mark.parametrize("name", METHODS)
def test_every_card_has_a_measured_effect_table(name):
    assert _TABLE.search(_measured_section(name)), f"docs/methods/{name}.md: the measured effect needs its table"


def test_the_instruments_are_registered_algorithms_and_not_methods():
    assert INSTRUMENTS and INSTRUMENTS <= set(REGISTRY) and not INSTRUMENTS & set(METHODS)


def test_the_index_of_measured_effects_is_generated_from_the_cards_as_they_are():
    import importlib.util
    spec = importlib.util.spec_from_file_location("method_cards", DOCS.parents[1] / "benchmarks" / "tools" / "method_cards.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    index = (DOCS / "README.md").read_text()
    assert index == script.build(), "docs/methods/README.md is out of date: run python -m benchmarks.tools.method_cards"
    for name in METHODS:   # every method appears, as a row or in the not-measured list
        assert f"[{name}]({name}.md)" in index, name
