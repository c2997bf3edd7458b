"""Run folders: what `hasten train` writes, and how a run continues without changing.

A run folder holds
- `recipe.yaml`: the recipe the run started with (with `schema_version`), written once and
  never changed afterwards;
- `resumes.jsonl`: one line per resume: when, the overrides given, and whether `--force`
  allowed a change of the run's mathematics;
- `checkpoints/` (with its own index and lock), `metrics.jsonl`, `tensorboard/`;
- `.hasten.lock`: held while a process writes the folder.

The recipe a run continues with is `recipe.yaml` with every recorded resume's overrides
applied in order. Overrides that do not change what the run computes (RESUME_SAFE: a longer
`max_duration`, the device, threads, progress bar, logging) are allowed on resume and
recorded; any other difference is listed and refused unless `force=True`.
"""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import yaml

from .config import RECIPE_SCHEMA_VERSION, Recipe, code_keys_set_by, load_recipe, parse_override, to_dict
from .errors import ConfigError, RunFolderError
from .files import atomic_write, os_error_message
from .usercode import check_trust

RECIPE_FILE = "recipe.yaml"
RESUMES_FILE = "resumes.jsonl"
TRACKERS_FILE = "trackers.json"   # the MLflow and W&B run ids, so that a resumed run continues them
RUN_OUTPUTS = ("metrics.jsonl", "tensorboard", RESUMES_FILE, TRACKERS_FILE, "profile")   # besides recipe.yaml and checkpoints/

# keys a resume may change: none of them changes the numbers the run computes
RESUME_SAFE = frozenset({
    "trainer.max_duration", "trainer.device", "trainer.threads", "trainer.progress_bar", "trainer.tensorboard",
    "trainer.mlflow", "trainer.wandb", "trainer.on_logger_error", "trainer.microbatch", "trainer.memory_limit", "trainer.profile",
    "trainer.log_interval", "trainer.host_allocator", "trainer.dist_timeout_s", "trainer.keep_last", "trainer.save_interval",
    "data.num_workers", "description"})
# keys a run records when it first builds its data (hasten.tasks.base.record): a recipe that
# leaves one unset continues with the recorded value; a different value is a change of the run
RECORDED = frozenset({"data.tokenizer_sha256", "data.classes"})
# keys that say where and how to resume, not what the run is
_RESUME_CONTROL = frozenset({"trainer.run_dir", "trainer.autoresume", "trainer.load_path", "trainer.load_mode"})


def _flat(d: dict, prefix: str = "") -> dict:
    """{'trainer.seed': 0, ...}; an algorithm's settings stay one value ('algorithms.ema': {...})."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and prefix != "algorithms.":
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def recipe_changes(before: Recipe, after: Recipe) -> dict[str, tuple]:
    """key -> (before, after) for every setting that differs (resume controls left out)."""
    a, b = _flat(to_dict(before)), _flat(to_dict(after))
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and k not in _RESUME_CONTROL}


def is_run_folder(folder: "str | Path") -> bool:
    return (Path(folder) / RECIPE_FILE).is_file()


def source_run(load_path: "str | Path") -> "Path | None":
    """The run folder a `trainer.load_path` comes from (the folder itself, a checkpoint in its
    checkpoints/, or that folder); None for anything else (a Hugging Face folder, a loose file)."""
    p = Path(load_path)
    for folder in (p, p.parent, p.parent.parent):
        if is_run_folder(folder):
            return folder
    return None


def check_tokenizer_of_source(load_path: "str | Path", digest: "str | None") -> None:
    """Fine-tuning from another run: the tokenizer this run built must be the one that run
    recorded (the same token ids mean the same text); a ConfigError naming both when not."""
    folder = source_run(load_path) if digest else None
    if folder is None:
        return
    try:
        recorded = ((yaml.safe_load((folder / RECIPE_FILE).read_text()) or {}).get("data") or {}).get("tokenizer_sha256")
    except (OSError, yaml.YAMLError, AttributeError):
        return   # its recipe.yaml is checked where it is read as a run
    if isinstance(recorded, str) and recorded != digest:
        raise ConfigError(f"trainer.load_path {load_path}: that run trained with another tokenizer (sha256 "
                          f"{recorded[:12]}...) than this run builds ({digest[:12]}...); its embeddings would read other "
                          "tokens. Build the same one (its corpus, vocab_size and tokenizer settings, or its "
                          "tokenizer file)")


def read_resumes(folder: "str | Path") -> list[dict]:
    path = Path(folder) / RESUMES_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue   # a torn last line from a kill: that resume never started training
    return out


def stored_recipe(folder: "str | Path", overrides: list[str] = ()) -> Recipe:
    """The recipe the run in `folder` continues with: recipe.yaml plus every recorded resume's
    overrides (and `overrides` after them)."""
    folder = Path(folder)
    if not is_run_folder(folder):
        raise RunFolderError(f"{folder} is not a hasten run folder (it has no {RECIPE_FILE}); "
                             "give the folder that `hasten train` printed as 'run folder'")
    recorded = [o for r in read_resumes(folder) for o in r.get("overrides", [])]
    recipe = load_recipe(str(folder / RECIPE_FILE), recorded + list(overrides))
    for key in code_keys_set_by(recorded) - code_keys_set_by(overrides):   # named by the folder's record, not the user
        recipe.origins[key] = str(folder / RESUMES_FILE)
    return recipe


def check_resume(folder: "str | Path", recipe: Recipe, force: bool = False,
                 stored: Recipe | None = None) -> dict[str, tuple]:
    """Compare `recipe` with the run stored in `folder` (`stored`, when the caller has read it
    already); returns the changes. Changes outside RESUME_SAFE raise ConfigError unless `force`."""
    stored = stored if stored is not None else stored_recipe(folder)
    for key in RECORDED:   # unset: the run's recorded value (checked against the data when it is built)
        section, name = key.split(".")
        held = getattr(getattr(stored, section), name, None)
        if held is not None and getattr(getattr(recipe, section), name, held) is None:
            setattr(getattr(recipe, section), name, held)
    changes = recipe_changes(stored, recipe)
    unsafe = {k: v for k, v in changes.items() if k not in RESUME_SAFE}
    if unsafe and not force:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in unsafe.items())
        raise ConfigError(f"resuming {folder} with these settings would change the run ({listed}). "
                          "Resume with the stored recipe (hasten train --resume RUN_DIR), pass --force to "
                          "change it anyway (recorded in resumes.jsonl), or start a new run.")
    return changes


def resume_recipe(folder: "str | Path", overrides: list[str] = (), force: bool = False,
                  trust_code: bool = False) -> Recipe:
    """The recipe to continue the run in `folder` with `overrides`; checks them (see check_resume)
    and the code the recipe names (hasten.usercode.check_trust: another user's folder needs
    `trust_code`)."""
    folder = Path(folder)
    for o in overrides:
        keys, _ = parse_override(o)
        if ".".join(keys) in _RESUME_CONTROL:
            raise ConfigError(f"{'.'.join(keys)} cannot be given with --resume: the run folder decides it")
    stored = stored_recipe(folder)
    recipe = stored_recipe(folder, overrides)   # the stored file names the run, so the name carries over
    recipe.trainer.run_dir, recipe.trainer.autoresume = str(folder), True
    check_resume(folder, recipe, force, stored)
    check_trust(recipe.origins, to_dict(recipe), trust_code, f"resuming {folder}")
    if trust_code:
        recipe.origins = {}   # the user's word covers this recipe wherever it is built
    return recipe


def check_run_folder(recipe: Recipe, run_dir: Path, force: bool = False) -> dict[str, tuple] | None:
    """Before anything is built: `run_dir` (proved writable and locked by the caller) must be
    new or hold this same run resumed. Returns the changes a resume makes (None for a new run)."""
    if not is_run_folder(run_dir):
        taken = [name for name in RUN_OUTPUTS if (run_dir / name).exists()]
        if taken:   # a new run writes these: never into files that another run or the user made
            raise RunFolderError(f"{run_dir} is not a hasten run folder but already holds {', '.join(taken)}, which "
                                 "a new run would write; choose an empty or new trainer.run_dir")
        return None
    if not recipe.trainer.autoresume:
        raise RunFolderError(f"{run_dir} already holds a run; continue it with `hasten train --resume {run_dir}`, "
                             "or choose another trainer.run_dir")
    return check_resume(run_dir, recipe, force)


def write_run_folder(recipe: Recipe, run_dir: Path, changes: dict[str, tuple] | None, force: bool = False) -> None:
    """A new run writes recipe.yaml; a resumed one leaves it and appends its record to resumes.jsonl."""
    if changes is None:
        data = {"schema_version": RECIPE_SCHEMA_VERSION, **to_dict(recipe)}
        data["trainer"] = {**data["trainer"], "run_dir": None, "autoresume": False}   # where it ran is not what it is
        atomic_write(run_dir / RECIPE_FILE, lambda f: yaml.safe_dump(data, f, sort_keys=False), binary=False)
        return
    # recorded as overrides, so that the next resume rebuilds exactly this recipe
    record = {"time": _dt.datetime.now().isoformat(timespec="seconds"),
              "overrides": [f"{k}={json.dumps(new)}" for k, (_, new) in changes.items()],
              "changes": {k: list(v) for k, v in changes.items()}, "forced": bool(force)}
    try:
        with open(run_dir / RESUMES_FILE, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")
    except OSError as e:
        raise RunFolderError(os_error_message(e, run_dir / RESUMES_FILE, "writing")) from e
