"""Typed configuration: dataclasses are the single source of truth.

A recipe is a YAML file whose sections load into the dataclasses below (and, for the
model, data and algorithm sections, into the config class registered under the section's
`name`). Overrides from the command line are `key.sub=value`, with the value read as YAML.
Every unknown key or badly typed value is an error that names the key, says what is
allowed, and suggests the closest match.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from .assembly.options import CheckpointOptions, Durations, ParallelOptions, StepOptions
from .distributed.fsdp import FSDPOptions
from .errors import ConfigError, brief
from .loggers.mlflow import options_problem as mlflow_options
from .loggers.wandb import options_problem as wandb_options
from .registry import ALGORITHMS, TASKS
from .runtime import names_float8
from .usercode import CODE_KEYS, origins_of
# the schema helpers live in a leaf module (tasks import them without importing this one)
from .schema import (NUMBER, DataSection, ModelSection, UnknownKey, coerce, device_string, fractions_below_one,
                     from_dict, recipe_section, reference_table, setting, signature_config, suggest, three_numbers)

RECIPE_SCHEMA_VERSION = 3   # recipe.yaml files in run folders record it; raised when keys move (2: nested optimizer
                            # keys; 3: trainer.fsdp.activation_checkpointing -> trainer.activation_checkpointing)


# ------------------------------------------------------------------------------ sections
@dataclass
class RunSettings:
    """The trainer section's own keys (the rest are the Trainer's options, hasten.assembly.options):
    on what the run computes, where it lives, and what it reports."""
    precision: Literal["fp32", "bf16-mixed", "fp16-mixed", "auto"] = "fp32"
    """auto: bf16-mixed where the hardware has bf16 (CUDA, AVX512-BF16/AMX CPUs), fp32 elsewhere."""
    device: str = setting("auto", check=device_string)
    """auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N or mps."""
    compile_mode: Optional[Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]] = None
    """torch.compile's mode, with compile: true (reduce-overhead and max-autotune capture CUDA graphs on a GPU: fewer launches a step); default: torch's."""
    seed: int = setting(0, ge=0)
    """Seed of model initialisation, data order and augmentation."""
    run_dir: Optional[str] = None
    """The run folder; default runs/RECIPE-DATE-TIME."""
    checkpoints: bool = True
    """false: write no checkpoints (benchmarks)."""
    progress_bar: bool = True
    """Show a progress bar with throughput."""
    tensorboard: bool = True
    """Write TensorBoard event files, when the tensorboard package is installed."""
    profile: Optional[int] = setting(None, ge=1)
    """Profile this many steps after 5 warm-up steps: where the time goes (a table at the end, RUN/profile/profile.md) and a trace for Perfetto (RUN/profile/trace.json)."""
    mlflow: Optional[dict[str, Any]] = setting(None, check=mlflow_options)
    """Log to MLflow (the mlflow extra): {} or {tracking_uri, experiment, run_name, tags}."""
    wandb: Optional[dict[str, Any]] = setting(None, check=wandb_options)
    """Log to Weights & Biases (the wandb extra): {} or {project, name, mode, dir, entity, tags}."""
    threads: Optional[int] = setting(None, ge=1)
    """torch.set_num_threads; default: leave as it is."""
    parallelism: Literal["auto", "none", "ddp", "fsdp"] = "auto"
    """How processes launched by torchrun train together: ddp (data-parallel), fsdp (data-parallel, model sharded), none, or auto (ddp with more than one process)."""
    dist_timeout_s: float = setting(600.0, gt=0)
    """Bound on every collective: a lost rank stops the others with an error after this many seconds."""
    host_allocator: Literal["auto", "tuned", "default"] = "auto"
    """glibc malloc settings; auto: tuned for CPU runs (hasten.allocator). hasten train/bench apply it; a Python Trainer leaves malloc alone unless asked."""


# The `trainer` section: the Trainer's option groups (each option declared once, with its range
# and docstring, in hasten.assembly.options) and the run's own settings. A run folder keeps only
# its latest checkpoint by default (a Python Trainer's Checkpoint keeps two).
TrainerConfig = recipe_section(
    "TrainerConfig", "The `trainer` section: how long, how often, on what, with which precision.",
    (Durations, StepOptions, CheckpointOptions, ParallelOptions, RunSettings), defaults={"keep_last": 1},
    order=("max_duration", "eval_interval", "log_interval", "precision", "device", "compile", "compile_mode",
           "compile_optimizer", "grad_accum", "microbatch", "activation_checkpointing", "memory_limit",
           "grad_clip_norm", "seed", "run_dir", "save_interval", "keep_last", "checkpoints", "autoresume", "load_path",
           "load_mode", "load_min_share", "progress_bar", "tensorboard", "profile", "mlflow", "wandb", "on_logger_error", "threads", "parallelism", "fsdp",
           "sync_batchnorm", "dist_timeout_s", "host_allocator"))


@dataclass
class SGDSettings:
    """`optimizer.sgd`: SGD's settings, for name sgd or sgdw, and for muon with muon.others=sgd."""
    momentum: float = setting(0.9, ge=0, lt=1)
    """Momentum."""
    nesterov: bool = False
    """Nesterov momentum."""
    per_example: bool = False
    """sgdw only: lr and weight_decay stated per example, momentum's gain included."""


@dataclass
class AdamSettings:
    """`optimizer.adam`: Adam's settings, for name adam or adamw, and for muon with muon.others=adamw."""
    betas: list[float] = setting(default_factory=lambda: [0.9, 0.999], check=fractions_below_one)
    """The moment decay rates, each in [0, 1)."""
    eps: float = setting(1e-8, gt=0)
    """Added to the denominator."""


@dataclass
class MuonSettings:
    """`optimizer.muon`: Muon's settings (name muon): Muon for the hidden matrices and conv kernels,
    `others` for the rest, with the section's common lr and weight_decay."""
    lr: float = setting(0.02, ge=0)
    """Muon's learning rate."""
    momentum: float = setting(0.95, ge=0, lt=1)
    """Muon's momentum."""
    weight_decay: float = setting(0.0, ge=0)
    """Muon's weight decay."""
    ns_steps: int = setting(5, ge=1)
    """Newton-Schulz iterations per update."""
    ns_coefficients: Optional[list[float]] = setting(None, check=three_numbers)
    """The quintic iteration's (a, b, c); null: torch.optim.Muon's (3.4445, -4.775, 2.0315)."""
    adjust_lr: Optional[str] = None
    """torch.optim.Muon adjust_lr_fn: null/'original' or 'match_rms_adamw'."""
    normalize: bool = False
    """Rescale each Muon parameter to norm sqrt(rows) before its update."""
    ns_dtype: Literal["auto", "bf16", "fp32"] = "auto"
    """Newton-Schulz precision; auto: follows trainer.precision (bf16 under bf16-mixed, fp32 otherwise)."""
    foreach: Optional[bool] = None
    """Multi-tensor kernels and the iteration batched over same-shape kernels (ConvMuon); null: on CUDA only, as torch.optim decides."""
    others: Literal["adamw", "sgd"] = "adamw"
    """The optimizer of the rest: adamw (optimizer.adam, one group) or sgd (optimizer.sgd, the group rules)."""


@dataclass
class OptimizerConfig:
    """The `optimizer` section: the keys every optimizer shares, and one sub-section per
    optimizer family (`sgd`, `adam`, `muon`); a sub-section the chosen optimizer does not use
    is an error."""
    name: Literal["sgd", "sgdw", "adamw", "adam", "muon"] = "adamw"
    """muon: Muon for hidden matrices and conv kernels, muon.others for the rest; sgdw: SGD with decoupled weight decay."""
    lr: float = setting(1e-3, ge=0)
    """Learning rate (of the non-Muon parameters with name=muon)."""
    weight_decay: float = setting(0.0, ge=0)
    """Weight decay (decoupled for adamw and sgdw)."""
    decay_min_dim: int = setting(2, ge=0)
    """Parameters with fewer dimensions (biases, norms) get no weight decay."""
    no_decay: list[str] = field(default_factory=list)
    """Parameter name patterns that get no weight decay."""
    lr_multipliers: dict[str, float] = field(default_factory=dict)
    """Name pattern -> multiple of lr for those parameters."""
    decay_ignores_lr_mult: bool = False
    """true: a group at m x lr gets weight_decay / m (the same decay per step)."""
    fused: Optional[bool] = None
    """Use the fused optimizer kernels; default: where the device supports them."""
    sgd: SGDSettings = field(default_factory=SGDSettings)
    """SGD's settings (optimizer.sgd.*)."""
    adam: AdamSettings = field(default_factory=AdamSettings)
    """Adam's settings (optimizer.adam.*)."""
    muon: MuonSettings = field(default_factory=MuonSettings)
    """Muon's settings (optimizer.muon.*)."""

    def uses(self, family: str) -> bool:
        """Whether the chosen optimizer reads the sub-section `family` (sgd, adam or muon)."""
        if family == "muon":
            return self.name == "muon"
        if self.name == "muon":   # the rest goes to adamw (the adam sub-section) or sgd
            return family == ("adam" if self.muon.others == "adamw" else "sgd")
        return self.name in {"sgd": ("sgd", "sgdw"), "adam": ("adam", "adamw")}[family]


OPTIMIZER_FAMILIES = ("sgd", "adam", "muon")   # the optimizer's sub-sections

# schema_version 1 (run folders written before the optimizer's sub-sections): flat keys -> their place now
FLAT_OPTIMIZER_KEYS = {
    "momentum": ("sgd", "momentum"), "nesterov": ("sgd", "nesterov"), "per_example": ("sgd", "per_example"),
    "betas": ("adam", "betas"), "eps": ("adam", "eps"),
    **{f"muon_{k}": ("muon", k) for k in ("lr", "momentum", "weight_decay", "ns_steps", "adjust_lr", "normalize",
                                           "ns_dtype", "others")},
}


def _nest_optimizer_keys(opt: dict) -> dict:
    """A version-1 optimizer section with its flat keys (`muon_lr`) moved to their sub-sections."""
    out = {k: (dict(v) if isinstance(v, dict) and k in OPTIMIZER_FAMILIES else v) for k, v in opt.items()}
    for old, (family, new) in FLAT_OPTIMIZER_KEYS.items():
        if old in out:
            out.setdefault(family, {})[new] = out.pop(old)
    return out


@dataclass
class ScheduleConfig:
    """The `schedule` section: the learning rate as a function of progress (hasten.optim.LRSchedule)."""
    name: Literal["constant", "linear", "cosine", "wsd"] = "constant"
    """The shape after warm-up; wsd: warm-up, stable, decay (warmdown)."""
    warmup: str = setting("0ba", time=True)
    """Linear warm-up from start_factor x lr (typed time)."""
    warmdown: Optional[str] = setting(None, time=True)
    """wsd: the length of the final decay (typed time)."""
    min_factor: float = setting(0.0, ge=0)
    """The lr at the end, as a multiple of lr."""
    start_factor: float = setting(0.0, ge=0)
    """The lr at the start of warm-up, as a multiple of lr."""


@dataclass
class Recipe:
    """A whole recipe, validated: the common sections, the task's own `model` and `data`
    sections (its TaskSpec's config classes), and the algorithms with their checked arguments."""
    task: str
    model: ModelSection
    """The task's model section (TaskSpec.model_config)."""
    data: DataSection
    """The task's data section (TaskSpec.data_config)."""
    description: str = ""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    algorithms: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Registry name -> the algorithm's keyword arguments, checked against its signature."""
    name: str = "recipe"
    origins: dict[str, Optional[str]] = field(default_factory=dict, repr=False, compare=False,
                                              metadata={"stored": False})
    """Not a recipe key: which file named the code of 'model.name' and 'data.factory' (None: the
    command line or a packaged recipe), for the trust rule (hasten.usercode)."""


# ------------------------------------------------------------------------------ overrides
def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.sub=value (e.g. trainer.max_duration=100ba)")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: bad key {key!r}")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and NUMBER.match(value):
        value = float(value)
    check_expanded_size(value, f"override {key}")
    return key.split("."), value


def apply_override(raw: dict, keys: list[str], value: Any) -> None:
    node = raw
    for i, k in enumerate(keys[:-1]):
        nxt = node.get(k)
        if nxt is None:
            nxt = node[k] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {'.'.join(keys)}: {'.'.join(keys[:i + 1])} is not a section")
        node = nxt
    if value is None and len(keys) == 2 and _removable(*keys):
        node.pop(keys[-1], None)     # algorithms.NAME=null removes an algorithm, optimizer.sgd=null a sub-section
    else:
        node[keys[-1]] = value


def _removable(section: str, key: str) -> bool:
    """Whether `section.key: null` removes the entry (an algorithm, an optimizer's sub-section)
    instead of setting the value None: on the command line and in a recipe with a `base:`."""
    return section == "algorithms" or section == "optimizer" and key in OPTIMIZER_FAMILIES


def _drop_removed(base: dict, top: dict) -> None:
    """`NAME: null` under `algorithms` (or `sgd`/`adam`/`muon: null` under `optimizer`) in a
    recipe with a `base:` removes what the base has by that name, as `algorithms.NAME=null`
    does on the command line; merged instead, the null would turn the base's algorithm into
    one with default arguments. A null for a name the base lacks is left alone (an algorithm
    with its defaults)."""
    for section in ("algorithms", "optimizer"):
        ours, theirs = top.get(section), base.get(section)
        if not (isinstance(ours, dict) and isinstance(theirs, dict)):
            continue
        for key in [k for k, v in ours.items() if v is None and k in theirs and _removable(section, k)]:
            del ours[key], theirs[key]


def _deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# ------------------------------------------------------------------------------ recipes
def recipe_dir():
    return resources.files("hasten").joinpath("recipes")


def available_recipes() -> dict[str, str]:
    """name -> one-line description of every packaged recipe."""
    out = {}
    for entry in sorted(recipe_dir().iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            data = yaml.safe_load(entry.read_text()) or {}
            out[entry.name[:-5]] = str(data.get("description", "")).strip().splitlines()[0] if data.get("description") else ""
    return out


MAX_BASE_DEPTH = 32


def _recipe_key(name_or_path: str) -> str:
    """What a recipe reference is, whatever its spelling: a file's real path, or a packaged name."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        try:
            return "file:" + os.path.realpath(p)
        except (OSError, ValueError):
            return "file:" + name_or_path
    return "packaged:" + name_or_path


def _short(name: str) -> str:
    """A recipe reference for a message: a file relative to here when that is shorter."""
    if not name.endswith((".yaml", ".yml")):
        return name
    try:
        rel = os.path.relpath(os.path.realpath(name))
    except (OSError, ValueError):
        return name[:120]
    return min(rel, name, key=len)[:120]


def _read_raw(name_or_path: str, seen: tuple = ()) -> tuple[dict, str, dict]:
    """(raw recipe, its name, which file named each code key: hasten.usercode.origins_of)."""
    p = Path(name_or_path)
    origin = None   # a packaged recipe is hasten's own
    if p.suffix in (".yaml", ".yml") and p.is_file():
        try:
            text, name = p.read_text(), p.stem
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read recipe {name_or_path}: {e}") from e
        origin = str(p.absolute())
    else:
        entry = recipe_dir().joinpath(f"{name_or_path}.yaml")
        if not entry.is_file():
            names = list(available_recipes())
            raise ConfigError(f"no recipe named {name_or_path!r} (and no such YAML file); packaged recipes: {names}."
                              + suggest(name_or_path, names))
        text, name = entry.read_text(), name_or_path
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {name_or_path}: invalid YAML: {brief(str(e), 300)}") from e
    check_expanded_size(raw, f"recipe {name_or_path}")
    if not isinstance(raw, dict):
        raise ConfigError(f"recipe {name_or_path}: the top level must be a mapping")
    raw = _migrate(raw, name_or_path)
    origins = origins_of(raw, origin)
    base = raw.pop("base", None)
    if base is not None:
        if not isinstance(base, str) or not base:
            raise ConfigError(f"recipe {name_or_path}: base: {brief(base)} must name a recipe or a YAML file")
        # a relative YAML path in 'base' is read from the folder of the file that names it
        if base.endswith((".yaml", ".yml")) and not Path(base).is_absolute() and p.suffix in (".yaml", ".yml"):
            base = str(p.parent / base)
        here, there = _recipe_key(name_or_path), _recipe_key(base)
        chain = [k for k, _ in seen] + [here]
        if there in chain:
            names = [n for _, n in seen] + [name_or_path, base]
            raise ConfigError(f"recipe {name_or_path}: its 'base' chain loops back to {_short(base)} "
                              f"({' -> '.join(_short(n) for n in names[chain.index(there):])}); "
                              "remove the base that names it")
        if len(chain) >= MAX_BASE_DEPTH:
            raise ConfigError(f"recipe {name_or_path}: a 'base' chain more than {MAX_BASE_DEPTH} recipes deep")
        base_raw, _, base_origins = _read_raw(base, seen + ((here, name_or_path),))
        base_raw.pop("description", None)
        _drop_removed(base_raw, raw)
        raw = _deep_merge(base_raw, raw)
        origins = {**base_origins, **origins}
    return raw, name, origins


MAX_RECIPE_VALUES = 100_000   # a recipe holds a few hundred values; YAML aliases can make billions


def check_expanded_size(value, where: str, limit: int = MAX_RECIPE_VALUES) -> None:
    """Refuse a YAML value that expands to more than `limit` values once its aliases are
    followed ("billion laughs": a few lines of anchors that reference each other), counting
    each reference anew as every later step (validation, messages, copies) would; the walk
    stops at the limit, so it is cheap whatever the size."""
    seen, stack = 0, [value]
    while stack:
        v = stack.pop()
        seen += 1
        if seen > limit:
            raise ConfigError(f"{where}: the YAML expands to more than {limit:,} values once its aliases (*name) are "
                              "followed; a recipe holds a few hundred. Write the values out, or reference fewer anchors")
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


def _migrate(raw: dict, where: str) -> dict:
    """Bring a recipe that states an older `schema_version` (a run folder's recipe.yaml) to the
    current keys: version 1 had flat optimizer keys (`optimizer.muon_lr`, nested since version
    2); versions 1-2 kept activation checkpointing under `trainer.fsdp` (`trainer.activation_checkpointing`
    since version 3). A recipe without `schema_version` is read as the current version."""
    stated = "schema_version" in raw
    version = raw.pop("schema_version", RECIPE_SCHEMA_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigError(f"recipe {where}: schema_version {brief(version)} must be a whole number >= 1")
    if version > RECIPE_SCHEMA_VERSION:
        raise ConfigError(f"recipe {where} was written by a newer hasten (schema_version {version}, this one reads "
                          f"up to {RECIPE_SCHEMA_VERSION}); upgrade hasten to read it")
    if stated and version < 2 and isinstance(raw.get("optimizer"), dict):
        # a version-1 run folder's recipe lists every flat key, defaults included: keep the sub-sections its optimizer uses
        opt = _nest_optimizer_keys(raw["optimizer"])
        probe = OptimizerConfig(name=opt.get("name", "adamw"),
                                muon=MuonSettings(others=(opt.get("muon") or {}).get("others", "adamw")))
        raw["optimizer"] = {k: v for k, v in opt.items() if k not in OPTIMIZER_FAMILIES or probe.uses(k)}
    trainer = raw.get("trainer")
    if stated and version < 3 and isinstance(trainer, dict) and isinstance(trainer.get("fsdp"), dict):
        trainer["fsdp"] = dict(trainer["fsdp"])
        if trainer["fsdp"].pop("activation_checkpointing", False):
            trainer["activation_checkpointing"] = True
    return raw


def load_recipe(name_or_path: str, overrides: list[str] = ()) -> Recipe:
    """Read a packaged recipe (by name) or a YAML file, apply overrides, validate everything."""
    raw, name, origins = _read_raw(name_or_path)
    for text in overrides:
        keys, value = parse_override(text)
        apply_override(raw, keys, value)
    for key in code_keys_set_by(overrides):   # named on the command line: the user's own
        origins.pop(key, None)
    raw.setdefault("name", name)
    recipe = validate(raw)
    recipe.origins = {k: v for k, v in origins.items() if v is not None}
    return recipe


def code_keys_set_by(overrides) -> set[str]:
    """The code keys ('model.name', 'data.factory') that these overrides set."""
    found = set()
    for text in overrides:
        keys, _ = parse_override(text)
        found |= {f"{section}.{key}" for section, key in CODE_KEYS if keys in ([section], [section, key])}
    return found


RECIPE_KEYS = ("task", "description", "model", "data", "optimizer", "schedule", "trainer", "algorithms", "name")


# the sections every recipe has, whatever its task (data and model come from the task)
SECTIONS = (("trainer", TrainerConfig), ("trainer.fsdp", FSDPOptions), ("optimizer", OptimizerConfig),
            ("optimizer.sgd", SGDSettings), ("optimizer.adam", AdamSettings), ("optimizer.muon", MuonSettings),
            ("schedule", ScheduleConfig))


def validate(raw: dict, tasks: dict | None = None, algorithms: dict | None = None) -> Recipe:
    """A Recipe from a raw mapping, every key and value checked. `tasks` and `algorithms` are
    the registries names are looked up in (default: hasten.registry's, filled by declaration)."""
    tasks = TASKS if tasks is None else tasks
    try:
        return _validate(raw, tasks, algorithms)
    except UnknownKey as e:
        if e.section == "optimizer" and e.key in FLAT_OPTIMIZER_KEYS:   # a key that moved at schema_version 2
            family, new = FLAT_OPTIMIZER_KEYS[e.key]
            raise ConfigError(f"optimizer.{e.key} is optimizer.{family}.{new} since recipes nest each optimizer's "
                              f"settings: write optimizer.{family}.{new}") from None
        homes = _homes_of(e.key, e.section, tasks.get(raw.get("task")) if isinstance(raw.get("task"), str) else None)
        if not homes:
            raise
        raise ConfigError(f"{e.base} {e.key!r} is a key of {' and '.join(homes)}: write "
                          f"{' or '.join(f'{h}.{e.key}' for h in homes)}") from None


def _homes_of(key: str, section: str, spec) -> list[str]:
    """The sections other than `section` that have `key` (trainer.lr -> optimizer)."""
    homes = list(SECTIONS)
    if spec is not None:
        homes += [("data", spec.data_config)] + ([("model", spec.model_config)]
                                                 if dataclasses.is_dataclass(spec.model_config) else [])
    return [name for name, cls in homes if name != section and key in {f.name for f in dataclasses.fields(cls)}]


def _validate(raw: dict, tasks: dict, algorithms: dict | None) -> Recipe:
    algorithms = ALGORITHMS if algorithms is None else algorithms
    where = raw.get("name", "recipe")
    for key in raw:
        if key not in RECIPE_KEYS:
            raise ConfigError(f"unknown key {key!r}; allowed keys here: {list(RECIPE_KEYS)}.{suggest(str(key), RECIPE_KEYS)}")
    if "task" not in raw:
        raise ConfigError(f"recipe {where}: missing required key 'task'; choose one of {sorted(tasks)}")
    task_name = coerce(raw["task"], str, "task")
    if task_name not in tasks:
        raise ConfigError(f"task: {task_name!r} is not a known task; choose one of {sorted(tasks)}."
                          + suggest(task_name, tasks))
    spec = tasks[task_name]
    opt_raw = raw.get("optimizer")
    opt = from_dict(OptimizerConfig, opt_raw, "optimizer")
    for family in OPTIMIZER_FAMILIES:
        given = (opt_raw or {}).get(family)
        if given and not opt.uses(family):
            users = {"sgd": "name sgd or sgdw, or muon with muon.others=sgd",
                     "adam": "name adam or adamw, or muon with muon.others=adamw", "muon": "name muon"}[family]
            chosen = opt.name + (f" with muon.others={opt.muon.others}" if opt.name == "muon" else "")
            raise ConfigError(f"optimizer.{family}.{next(iter(given))}: optimizer.{family} applies to {users}, and "
                              f"this recipe's optimizer is {chosen}; remove the sub-section (optimizer.{family}=null "
                              "as an override) or change optimizer.name")
    if opt.sgd.per_example and opt.name != "sgdw":
        raise ConfigError(f"optimizer.sgd.per_example applies to sgdw only, not {opt.name!r}")
    precision = (raw.get("trainer") or {}).get("precision") if isinstance(raw.get("trainer"), dict) else None
    if names_float8(precision):
        raise ConfigError(f"trainer.precision: {precision!r} is not a precision here; float8 training is an "
                          "algorithm on top of bf16-mixed: trainer.precision=bf16-mixed algorithms.float8_training={} "
                          "(docs/methods/float8_training.md)")
    trainer = from_dict(TrainerConfig, raw.get("trainer"), "trainer")
    algos = {}
    algo_raw = coerce(raw.get("algorithms"), dict, "algorithms")
    for algo_name, params in algo_raw.items():
        if algo_name not in algorithms:
            raise ConfigError(f"algorithms.{algo_name}: unknown algorithm; known: {sorted(algorithms)}."
                              + suggest(algo_name, algorithms))
        if params is not None and not isinstance(params, dict):
            raise ConfigError(f"algorithms.{algo_name}: {brief(params)} is not a section; give the algorithm's "
                              f"settings as a mapping, e.g. algorithms.{algo_name}={{}} for its defaults "
                              f"(algorithms.{algo_name}=null removes it)")
        algos[algo_name] = signature_config(algorithms[algo_name].__init__, params or {}, f"algorithms.{algo_name}")
        make_algorithm(algo_name, algos[algo_name], algorithms)   # the values too: building one is cheap and checks them
    return Recipe(task=task_name, model=spec.parse_model(raw.get("model") or {}),
                  data=from_dict(spec.data_config, raw.get("data"), "data"),
                  description=coerce(raw.get("description", ""), str, "description"), optimizer=opt,
                  schedule=from_dict(ScheduleConfig, raw.get("schedule"), "schedule"), trainer=trainer,
                  algorithms=algos, name=coerce(raw.get("name", "recipe"), str, "name"))


def reference() -> str:
    """docs/configuration-reference.md, generated from the config classes and the docstring
    under each field: `python -m hasten.config > docs/configuration-reference.md`."""
    parts = ["# Configuration reference", "",
             "Generated from the config classes (`python -m hasten.config > docs/configuration-reference.md`); "
             "a test checks that it is current. Ranges are checked when a recipe is loaded. "
             "See [configuration.md](configuration.md) for recipes and overrides.", ""]
    for name, cls in SECTIONS:
        parts += [f"## {name}", "", (cls.__doc__ or "").strip(), "", reference_table(cls, name), ""]
    for task in sorted(dict.fromkeys(TASKS.values()), key=lambda t: t.name):
        aliases = sorted((task.name, *task.aliases))
        parts += [f"## data (task: {' or '.join(aliases)})", "", reference_table(task.data_config, "data"), ""]
        if not hasattr(task.model_config, "as_recipe"):   # a config of its own, not a model picked by name
            parts += [f"## model (task: {' or '.join(aliases)})", "", reference_table(task.model_config, "model"), ""]
        else:
            parts += [f"## model (task: {' or '.join(aliases)})", "",
                      "`model.name` picks a model of `hasten.models.MODELS`; the other keys are its constructor's "
                      "arguments, checked against its signature.", ""]
    parts += ["## algorithms", "", "`algorithms.NAME` takes the keyword arguments of the algorithm registered "
              "as NAME (`hasten.algorithms.REGISTRY`); their values are checked by building the algorithm. "
              "Each algorithm's card in [methods/](methods/) lists its knobs.", ""]
    return "\n".join(parts)


def make_algorithm(name: str, params: dict, algorithms: dict | None = None):
    """Build the algorithm registered as `name`; a bad argument is a ConfigError naming it."""
    try:
        return (ALGORITHMS if algorithms is None else algorithms)[name](**params)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"algorithms.{name}: {e}") from e


def to_dict(recipe: Recipe) -> dict:
    """A plain, YAML-able dict of a validated recipe (for run folders and reports); the
    optimizer's sub-sections that its optimizer does not use are left out."""
    def plain(v):
        if hasattr(v, "as_recipe"):   # a config whose YAML form is not its fields (tasks.NamedModel)
            return plain(v.as_recipe())
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v) if f.metadata.get("stored", True)}
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v
    out = plain(recipe)
    if isinstance(recipe.optimizer, OptimizerConfig):
        out["optimizer"] = {k: v for k, v in out["optimizer"].items()
                            if k not in OPTIMIZER_FAMILIES or recipe.optimizer.uses(k)}
    return out


if __name__ == "__main__":
    print(reference(), end="")
