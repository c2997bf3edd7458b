"""Every key of the configuration reference, given a value of the wrong type and one out of
range, is refused when the recipe loads, in one line that names the key."""
import dataclasses
import math
import typing
from typing import Any, Literal, Union

import pytest

from hasten.config import SECTIONS, load_recipe
from hasten.errors import ConfigError
from hasten.tasks import TASKS

# a packaged recipe of each task, to override
RECIPE_OF = {"char_lm": "shakespeare-char-baseline", "image_classification": "cifar10-narrow",
             "masked_lm": "prose-bert-baseline", "text_classification": "spam-bert-finetune"}


def _sections():
    """(recipe, key path prefix, config class) for every section a recipe has."""
    out = [("shakespeare-char-baseline", name, cls) for name, cls in SECTIONS]
    for spec in dict.fromkeys(TASKS.values()):
        out.append((RECIPE_OF[spec.name], "data", spec.data_config))
        if dataclasses.is_dataclass(spec.model_config) and not hasattr(spec.model_config, "as_recipe"):
            out.append((RECIPE_OF[spec.name], "model", spec.model_config))
    return out


def _wrong_type(tp):
    """A YAML value (as an override writes it) that type `tp` does not take; None if it takes anything."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return None
    if origin in (Union, typing.get_origin(int | None)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if any(a is Any for a in args):
            return None
        if all(a in (int, float) or typing.get_origin(a) is Literal for a in args):
            return "not-a-number"
        if any(a is str for a in args) or any(typing.get_origin(a) in (dict,) for a in args):
            return "[1, 2]" if not any(typing.get_origin(a) in (list, tuple) for a in args) else "{a: 1}"
        return "not-a-number"
    if origin is Literal:
        return "not-a-choice"
    if origin in (list, tuple):
        return "5"
    if origin is dict or tp is dict:
        return "5"
    if dataclasses.is_dataclass(tp):
        return None   # a sub-section: its own keys are tested
    return {bool: "maybe", int: "not-a-number", float: "not-a-number", str: "{a: 1}"}.get(tp)


def _out_of_range(field, tp):
    """A value outside what the field declares, or past what its type can hold."""
    meta = field.metadata
    if "ge" in meta:
        return str(meta["ge"] - 1 if isinstance(meta["ge"], int) else meta["ge"] - 0.5)
    if "gt" in meta:
        return str(meta["gt"] - 1)
    if "le" in meta:
        return str(meta["le"] + 1)
    if "lt" in meta:
        return str(meta["lt"] + 1)
    if meta.get("interval"):
        return "0ba"
    if meta.get("time"):
        return "-5ba"
    base = {a for a in (typing.get_args(tp) or (tp,)) if a is not type(None)}
    if int in base:
        return "1e30"   # no whole-number setting holds more than 64 bits
    if float in base:
        return ".nan"
    return None


CASES = []
for recipe, prefix, cls in _sections():
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}"
        for kind, value in (("wrong type", _wrong_type(hints[f.name])), ("out of range", _out_of_range(f, hints[f.name]))):
            if value is not None:
                CASES.append(pytest.param(recipe, key, value, id=f"{recipe}:{key}:{kind}"))


@pytest.mark.parametrize("recipe,key,value", CASES)
def test_a_bad_value_of_every_key_is_one_line_naming_it(recipe, key, value):
    with pytest.raises(ConfigError) as e:
        load_recipe(recipe, [f"{key}={value}"])
    text = str(e.value)
    assert key in text and "\n" not in text, text


def test_the_cases_cover_every_section():
    assert len(CASES) > 150 and {c.values[1].split(".")[0] for c in CASES} >= {"trainer", "optimizer", "schedule",
                                                                                 "data", "model"}
    assert math.isfinite(len(CASES))
