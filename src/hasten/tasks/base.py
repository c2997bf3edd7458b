"""A task as a typed spec: its config classes, its builder, how its runs are judged, and
what it builds for the trainer."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import torch
from torch.utils.data import DataLoader, Dataset

from ..data.batches import inputs_targets
from ..errors import ConfigError, DataError
from ..schema import DataSection, ModelSection  # noqa: F401 (re-exported)
from ..integrations import hf
from ..data.loaders import make_dataloader
from ..usercode import build_module, call, check_target, is_target, named_by


@dataclass
class Built:
    """What a task builds for the trainer."""
    model: torch.nn.Module
    train_dataloader: Any
    eval_dataloader: Any
    metrics: dict = field(default_factory=dict)
    loss_fn: Callable | None = None
    flops_per_sample: float | None = None
    info: dict = field(default_factory=dict)   # for the summary printed at the end


@dataclass
class NamedModel:
    """A `model` section that picks a model by name from a registry; `args` are its
    constructor's keyword arguments, checked against its signature. In YAML the arguments
    sit beside the name: `model: {name: speedrun, widths: [64, 256, 256]}`."""
    name: str
    args: dict = field(default_factory=dict)

    def as_recipe(self) -> dict:
        return {"name": self.name, **self.args}


def hf_model_section(raw: dict) -> "NamedModel | None":
    """A model section every task takes besides its own models: `{name: hf/KIND, ...}` (a
    `transformers` model type and its config's keys, built offline by
    hasten.integrations.hf) or `{name: my_pkg.models:Net, ...}` (a user's module class or
    factory and its keyword arguments, hasten.usercode); None for any other section."""
    name = (raw or {}).get("name")
    if isinstance(name, str) and name.startswith("hf/"):
        if len(name) == 3:
            raise ConfigError("model.name: hf/ needs a transformers model type after it, e.g. hf/bert, hf/gpt2, hf/vit")
        return NamedModel(name, {k: v for k, v in raw.items() if k != "name"})
    if is_target(name):
        return NamedModel(check_target(name, "model.name"), {k: v for k, v in raw.items() if k != "name"})
    return None


def build_named(kind: str, m: NamedModel, hf_args: dict, user_args: dict) -> torch.nn.Module:
    """The model of a `hf/KIND` or `module:Class` section. A `transformers` config takes
    `hf_args` (what the task knows, under the config's names) under the recipe's keys; a
    user's class or factory each of `user_args` (hasten's names: vocab_size, num_classes,
    block_size, image_size, pad_id) that it accepts by name and the recipe does not give."""
    if m.name.startswith("hf/"):
        return hf.build_model(kind, m.name[3:], **{**hf_args, **m.args})
    return build_module(m.name, m.args, user_args)


def user_loaders(factory: str, args: dict, batch_size: int, eval_batch_size: int, seed: int,
                 num_workers: "int | None" = None, drop_last: bool = False) -> tuple[Any, Any, Any]:
    """(training loader, evaluation loader, what the factory gave for training) from a user's
    `data.factory` (`module:function`).

    The function is called with `data.factory_args`, plus `batch_size`, `eval_batch_size` and
    `seed` where it takes them by name. It returns `(train, eval)` or `{"train": ..., "eval":
    ...}`; each a map-style Dataset of (inputs, target) pairs (hasten makes its resumable,
    seeded DataLoader: shuffled for training, `data.batch_size` a batch) or any iterable of
    batches (a DataLoader, used as it is). `eval` may be None (no evaluation)."""
    made = call(factory, "data.factory", args, {"batch_size": batch_size, "eval_batch_size": eval_batch_size,
                                                "seed": seed})
    if isinstance(made, dict) and "train" in made:
        train, evaluation = made["train"], made.get("eval")
    elif isinstance(made, (tuple, list)) and len(made) == 2:
        train, evaluation = made
    else:
        raise ConfigError(f"data.factory: {factory} returned {_kind(made)}; return (train, eval) or "
                          "{'train': ..., 'eval': ...}, each a Dataset or a DataLoader (eval may be None)")

    def loader(x, split, size, shuffle):
        if x is None and split == "eval":
            return None
        if isinstance(x, Dataset) and hasattr(x, "__getitem__") and hasattr(x, "__len__"):
            if len(x) == 0:
                raise ConfigError(f"data.factory: {factory} returned an empty {split} dataset")
            try:
                first = x[0]
            except Exception as e:
                raise ConfigError(f"data.factory: {factory}'s {split} dataset failed on item 0: {type(e).__name__}: "
                                  f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}") from None
            if not (isinstance(first, (tuple, list)) and len(first) >= 2 or isinstance(first, dict) and "input" in first):
                raise ConfigError(f"data.factory: {factory}'s {split} dataset gives {_kind(first)} as an item; each "
                                  "item must be an (inputs, target) pair (or a dict with 'input' and 'target')")
            return make_dataloader(x, size, shuffle=shuffle, seed=seed, num_workers=num_workers,
                                   drop_last=drop_last and shuffle, seed_samples=True)
        if isinstance(x, (Dataset, DataLoader)) or (hasattr(x, "__iter__") and not isinstance(x, (str, bytes, dict))):
            return x
        raise ConfigError(f"data.factory: {factory} returned {_kind(x)} for {split}; give a Dataset or a DataLoader")

    return loader(train, "train", batch_size, True), loader(evaluation, "eval", eval_batch_size, False), train


def _kind(x) -> str:
    return "None" if x is None else f"a {type(x).__name__}"


@dataclass(frozen=True)
class Quality:
    """How a task's runs are judged: the metric its evaluation logs and which way is better."""
    metric: str                          # e.g. "val/acc"
    direction: Literal["max", "min"]     # "max": higher is better

    @property
    def op(self) -> str:
        """The comparison a target on this metric uses: '>=' when higher is better, else '<='."""
        return ">=" if self.direction == "max" else "<="

    def better(self, a: float, b: float) -> bool:
        """Whether `a` is better than `b`."""
        return a > b if self.direction == "max" else a < b


def first_inputs(built: Built, n: int) -> torch.Tensor:
    """`n` inputs for the task's model: the first training batch's inputs, repeated or cut to
    `n`, in their memory format (what latency measurement and export feed the model)."""
    x, _ = inputs_targets(next(iter(built.train_dataloader)))
    if isinstance(x, dict):   # keyword inputs (token ids and their documents): each repeated alike
        return {k: first_inputs_of(v, n) for k, v in x.items()}
    return first_inputs_of(x, n)


def first_inputs_of(x: torch.Tensor, n: int) -> torch.Tensor:
    layout = (torch.channels_last if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
              and not x.is_contiguous() else torch.contiguous_format)
    reps = -(-n // len(x))
    return x.repeat(reps, *([1] * (x.dim() - 1)))[:n].contiguous(memory_format=layout)


@dataclass(frozen=True)
class TaskSpec:
    """How a recipe's `model` and `data` sections become a model and dataloaders, and how the
    runs are judged.

    data_config: the dataclass of the `data` section (every task's has `batch_size`, the
        global batch of one optimizer step).
    model_config: the dataclass of the `model` section.
    parse_model: the raw `model` section -> a `model_config` (validated).
    build: `build(recipe, runtime) -> Built`; the runtime (hasten.runtime) is resolved and
        seeded before it is called, so the model it makes is initialised under the seed.
    quality: the metric a run is judged by and its direction (bench targets, compress reports).
    logs: the metrics its evaluation logs (a bench target must name one of them).
    example_inputs: `f(built, n)` -> `n` inputs for the model (latency and export).
    compress_refusal: why `hasten compress` cannot take this task's runs; None when it can.
    """
    name: str
    description: str
    data_config: type
    model_config: type
    parse_model: Callable[[dict], Any]
    build: Callable[[Any, Any], Built]
    quality: Quality
    logs: tuple[str, ...] = ("val/loss",)
    aliases: tuple[str, ...] = ()
    example_inputs: Callable[[Built, int], torch.Tensor] = first_inputs
    compress_refusal: str | None = None

    def make(self, recipe, runtime) -> Built:
        """`build`, with the code the recipe names imported under the trust rule: each import
        path is checked against the file that named it (recipe.origins, hasten.usercode); then
        what identifies the data is checked against the recipe and recorded in it (`record`)."""
        with named_by(getattr(recipe, "origins", None)):
            built = self.build(recipe, runtime)
        record(recipe, built)
        return built


def digest_problem(value) -> "str | None":
    ok = value is None or isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    return None if ok else "give the 64 lowercase hex digits of a SHA-256, or leave it unset (the run records it)"


def record(recipe, built: Built) -> None:
    """What a run's data depends on, checked against what the recipe recorded and recorded where
    it was not: the tokenizer's digest (`data.tokenizer_sha256`) and the class list
    (`data.classes`). A run folder's recipe.yaml, and the recipe kept in each artifact, then
    carry them, so a resume, an evaluation or a compression refuses data that became other."""
    d = recipe.data
    tok = built.info.get("tokenizer")
    if hasattr(d, "tokenizer_sha256") and getattr(tok, "digest", None):
        if d.tokenizer_sha256 is not None and d.tokenizer_sha256 != tok.digest:
            raise DataError(f"{getattr(d, 'source', 'the data')}: the tokenizer built now (sha256 {tok.digest[:12]}...) is "
                            f"not the one this run recorded ({d.tokenizer_sha256[:12]}...): the corpus or the tokenizer "
                            "file changed since. Restore them, or start a new run (a new data.tokenizer_sha256)")
        d.tokenizer_sha256 = tok.digest
    if hasattr(d, "classes") and built.info.get("classes") is not None:
        d.classes = list(built.info["classes"])
