"""The files `hasten compress` writes, named before anything is written, and never a file it
did not write.

An artifact `NAME.hasten` comes with its report `NAME.md` and `NAME.json` (and `NAME.pt2` with
--export). Each output folder keeps an index, `.hasten-compress.json`, of the files compress
wrote there: their SHA-256 and the settings that made them. A file is overwritten only when
the index lists it with the content it still has (`hasten.outputs`'s rule, the one every
command that writes output follows, with the settings kept beside each file); anything else in the way is refused in one line, and so is a checkpoint folder.

Names: by default `RUN/compressed/TAG.hasten`, TAG saying what was done (`prune0.5-ft200ba-lr0.1`);
when an artifact of that name was made with other settings (another checkpoint, other
overrides), the new one gets the next free name (`TAG-2.hasten`). An `--out` the user names
that holds an artifact of other settings is refused instead of replaced. Leftover temporaries
of a killed compress (`.NAME.*.tmp`, what atomic writes leave) are removed before writing.
"""
from __future__ import annotations

import os
from pathlib import Path

from .. import outputs as owned_files
from ..callbacks.checkpoint import INDEX as CHECKPOINT_INDEX
from ..checkpoint.format import NAME as CHECKPOINT_NAME
from ..errors import ConfigError

INDEX = ".hasten-compress.json"
SUFFIX = ".hasten"


def read_index(folder: Path) -> dict:
    """name -> {"sha256", "settings"} of the files compress wrote in `folder`."""
    return owned_files.read_index(folder, INDEX)


def companions(artifact: Path, export: bool) -> list[Path]:
    """Every file one compression writes: the artifact, its reports, its exported program."""
    stem = artifact.with_suffix("")
    out = [artifact, Path(f"{stem}.md"), Path(f"{stem}.json")]
    return out + ([Path(f"{stem}.pt2")] if export else [])


def _in_checkpoint_folder(path: Path) -> bool:
    folder = path.parent
    return (CHECKPOINT_NAME.match(path.name) is not None or (folder / CHECKPOINT_INDEX).exists()
            or folder.name == "checkpoints" and (folder.parent / "recipe.yaml").exists())


def _owned(path: Path, index: dict) -> bool:
    return owned_files.owned(path, index.get(path.name))


def plan(default_dir: Path, tag: str, out: "str | Path | None", export: bool, settings: dict) -> list[Path]:
    """The files this compression will write (artifact first), checked: an --out that names no
    artifact or lies in a checkpoint folder, or any file in the way that compress did not write,
    is a ConfigError; a default name taken by other settings moves to the next free one."""
    if out is not None:
        artifact = Path(out)
        if artifact.suffix != SUFFIX:
            raise ConfigError(f"--out {out}: an artifact's name ends in {SUFFIX} (its reports go beside it as "
                              f"NAME.md and NAME.json); e.g. --out {artifact.with_suffix(SUFFIX).name}")
        candidates = [artifact]
    else:
        candidates = [default_dir / f"{tag}{SUFFIX}"] + [default_dir / f"{tag}-{i}{SUFFIX}" for i in range(2, 1000)]
    for artifact in candidates:
        if _in_checkpoint_folder(artifact):
            raise ConfigError(f"--out {artifact}: that is a checkpoint folder (or a checkpoint's name); hasten compress "
                              "never writes among checkpoints. Give a path elsewhere, e.g. RUN/compressed/NAME.hasten")
        files = companions(artifact, export)
        index = read_index(artifact.parent)
        taken = [p for p in files if os.path.lexists(p)]
        foreign = [p for p in taken if not _owned(p, index)]
        same = all(index.get(p.name, {}).get("settings") == settings for p in taken)
        if not taken or (not foreign and same):
            return files
        if out is not None:
            if foreign:
                raise ConfigError(f"{foreign[0]} exists and hasten compress did not write it (or it was changed since); "
                                  "compress overwrites only its own files: choose another --out or move it away")
            raise ConfigError(f"{artifact} holds an artifact made with other settings; choose another --out, or remove "
                              "it first if it is no longer wanted")
    raise ConfigError(f"no free artifact name for {tag} in {default_dir}; give --out")


def clear_temporaries(files: list[Path]) -> None:
    """Remove what a killed write of these very files left (`.NAME.*.tmp` beside each)."""
    for p in files:
        if p.parent.is_dir():
            for left in p.parent.glob(f".{p.name}.*.tmp"):
                if left.is_file() and not left.is_symlink():
                    left.unlink()


def claim(files: list[Path], settings: dict) -> None:
    """Before writing: list the files in their folder's index as being written by this compress
    (a compress stopped half-way leaves them claimed, so the next one may replace them)."""
    _update(files, settings, pending=True)


def record(files: list[Path], settings: dict) -> None:
    """After writing: the files' content in the index (those not written leave it)."""
    _update(files, settings, pending=False)


def _update(files: list[Path], settings: dict, pending: bool) -> None:
    owned_files.update(files[0].parent, [p.name for p in files], pending, {"settings": settings}, INDEX)
