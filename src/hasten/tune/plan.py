"""What `hasten tune` searches on this machine and how it reads a trial: the stages and their
options (each decided from the recipe and what this machine has), the recipe's own setting in
each (the incumbent), a trial's throughput with its 95% interval, the machine a result holds
for and where it is cached."""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..bench.stats import median_ci
from ..config import Recipe, to_dict
from ..data.download import data_root
from ..hardware import cpu_features, cpu_has_bf16, cpu_name, kernel_caps
from ..runtime import resolve_device, resolve_precision


GUARDED = ("precision", "compile", "optimizer_step")   # stages whose options change the arithmetic
BATCH_STATS = "microbatch"   # changes it too where the model normalises over the batch (batch norm)
KEYS = {"precision": "trainer.precision=", "compile": ("trainer.compile=", "trainer.compile_mode="),   # prefixes
        "optimizer_step": "trainer.compile_optimizer=",
        "microbatch": "trainer.microbatch="}


@dataclass
class Option:
    stage: str
    label: str
    overrides: list[str]
    note: str = ""


@dataclass
class Trial:
    option: Option
    results: list[dict] = field(default_factory=list)

    @property
    def times(self) -> list[float]:
        return [t for r in self.results if r.get("status") == "ok" for t in r["times"][r["warmup"]:]]

    @property
    def failure(self) -> str | None:
        bad = [r for r in self.results if r.get("status") != "ok"]
        return f"{bad[0]['status']}: {bad[0].get('reason', '')}" if bad else None


def machine_key() -> dict:
    """What the measurements hold for: the CPU and its flags, whether bf16 runs natively in this
    process (False under a oneDNN cap below AVX-512 whatever the flags), the kernel caps it runs
    under where there are any (so a capped result is never served to an uncapped call), the GPU, torch."""
    key = {"cpu": cpu_name(), "flags": cpu_features(), "bf16_hardware": cpu_has_bf16(), "cores": os.cpu_count(),
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    caps = kernel_caps()
    return {**key, "kernel_caps": caps} if caps else key


def bf16_fast() -> bool:
    return torch.cuda.is_available() or cpu_has_bf16()


def throughput(trial: Trial, batch: int) -> dict | None:
    """Samples per second from the median step time, with its 95% interval (from the step times'
    bootstrap interval), over every measured step of every round."""
    xs = trial.times
    if len(xs) < 3:
        return None
    med, lo, hi = median_ci(xs)
    return {"samples_per_s": batch / med, "low": batch / hi, "high": batch / lo, "step_s": med, "steps": len(xs)}


def stages(recipe: Recipe, facts: "dict | None" = None) -> list[tuple[str, list[Option], str]]:
    """The stages to search for this recipe on this machine: (name, options, why skipped or '').
    `facts`: what the recipe built, as the trial of the recipe as written reported it
    (tune.worker.model_facts: 2-D convolutions, batch norm, the loader's kind); the stages follow
    the model and loaders built, never the task's name. Without them (before that trial) every
    stage that could apply is listed."""
    facts = facts or {}
    out = []
    t, d = recipe.trainer, recipe.data
    cuda = torch.cuda.is_available()
    written = t.precision
    prec = [Option("precision", "fp32", ["trainer.precision=fp32"])]
    if bf16_fast():
        prec.append(Option("precision", "bf16-mixed", ["trainer.precision=bf16-mixed"]))
    if cuda:
        prec.append(Option("precision", "fp16-mixed", ["trainer.precision=fp16-mixed"]))
    out.append(("precision", prec, "" if len(prec) > 1 else
                f"fp32 only: this CPU has no bf16 hardware (bf16 would be emulated, many times slower); "
                f"the recipe asks {written}"))
    conv = facts.get("conv2d", True)
    plain = ["algorithms.channels_last=null"] + (["data.channels_last=false"] if getattr(d, "channels_last", False) else [])
    out.append(("channels_last", [Option("channels_last", "contiguous", plain),
                                  Option("channels_last", "channels-last", ["algorithms.channels_last={}"])] if conv else [],
                "" if conv else f"the model built ({facts.get('model', 'the model')}) has no 2-D convolutions"))
    comp = [Option("compile", "eager", ["trainer.compile=false"]),
            Option("compile", "compiled", ["trainer.compile=true"])]
    if cuda:   # CUDA graphs: a step's kernels replayed in one launch, for steps that wait on the host
        comp.append(Option("compile", "reduce-overhead", ["trainer.compile=true", "trainer.compile_mode=reduce-overhead"]))
    out.append(("compile", comp, ""))
    # the optimizers' steps compiled: fewer launches and less host time a step, which a GPU step waits on
    out.append(("optimizer_step", [Option("optimizer_step", "eager", ["trainer.compile_optimizer=false"]),
                                   Option("optimizer_step", "compiled", ["trainer.compile_optimizer=true"])] if cuda else [],
                "" if cuda else "a CPU step's time is its kernels', not the host's (compiled optimizer steps: "
                                "1.05x [0.85, 1.30] on shakespeare-char-fast, docs/trainer.md)"))
    if getattr(d, "factory", None):
        out.append(("loader", [], f"data.factory: your loaders ({facts.get('loader', 'as given')}) are used as given"))
    elif getattr(d, "stream", None):
        out.append(("loader", [], "data.stream: a streamed source is read by DataLoader workers"))
    elif hasattr(d, "loader"):
        workers = _loader_workers()
        out.append(("loader", [Option("loader", "device", ["data.loader=device"]),
                               Option("loader", f"dataloader x{workers}", ["data.loader=dataloader",
                                                                          f"data.num_workers={workers}",
                                                                          "data.channels_last=false"])], ""))
    else:
        out.append(("loader", [], "the task has one data path"))
    cores = os.cpu_count() or 1
    if not cuda and cores > 1:
        counts = [cores, cores - 1] + ([t.threads] if t.threads and t.threads not in (cores, cores - 1) else [])
        out.append(("threads", [Option("threads", f"{n} threads", [f"trainer.threads={n}"]) for n in counts], ""))
        out.append(("host_allocator", [Option("host_allocator", "glibc default", ["trainer.host_allocator=default"]),
                                       Option("host_allocator", "tuned", ["trainer.host_allocator=tuned"])], ""))
    else:
        out.append(("threads", [], "a GPU run" if cuda else "one core"))
    b = d.batch_size
    sizes = [m for m in (b // 2, b // 4) if m >= 1]
    out.append(("microbatch", [Option("microbatch", f"whole batch ({b})", ["trainer.microbatch=null"])]
                + [Option("microbatch", f"micro-batches of {m}", [f"trainer.microbatch={m}"]) for m in sizes], ""))
    # each stage's first option is its incumbent, which stays unless another beats it: the
    # recipe's own setting where it is among the options, so that nothing is handed over that
    # did not beat what the recipe does (hasten's tuned allocator, a compiled recipe...)
    owns = {name: own_setting(name, recipe) for name, _, _ in out}
    return [(name, sorted(options, key=lambda o: o.label != owns[name]), why) for name, options, why in out]


def _loader_workers() -> int:
    """The worker count of the loader stage's DataLoader option: every core but the trainer's."""
    return max(1, (os.cpu_count() or 2) - 1)


def own_setting(stage: str, recipe: Recipe) -> str:
    """The label of the option that is the recipe's own setting for `stage` on this machine
    ('' where no option of the stage is)."""
    t, d = recipe.trainer, recipe.data
    if stage == "precision":
        return own_precision(recipe)
    if stage == "channels_last":
        return "channels-last" if "channels_last" in recipe.algorithms else "contiguous"
    if stage == "compile":
        return ("eager" if not t.compile else
                "reduce-overhead" if t.compile_mode == "reduce-overhead" else "compiled")
    if stage == "optimizer_step":
        return "compiled" if t.compile_optimizer else "eager"
    if stage == "loader":
        return "device" if getattr(d, "loader", None) == "device" else f"dataloader x{_loader_workers()}"
    if stage == "threads":
        return f"{t.threads or os.cpu_count() or 1} threads"
    if stage == "host_allocator":   # auto: tuned for a CPU run, which is where this stage is searched
        return "glibc default" if t.host_allocator == "default" else "tuned"
    if stage == "microbatch":
        return _default(stage, recipe)
    return ""


def round_medians(trial: Trial) -> dict[int, float]:
    """The median measured step time of each round the option ran in."""
    out = {}
    for i, r in enumerate(trial.results):
        if r.get("status") == "ok" and len(r["times"]) > r["warmup"]:
            out[r.get("round", i)] = statistics.median(r["times"][r["warmup"]:])
    return out


def first_step_extra(trial: Trial) -> float:
    """The first step's extra time over the measured median (compilation), median over rounds."""
    xs = [max(0.0, r["times"][0] - statistics.median(r["times"][r["warmup"]:]))
          for r in trial.results if r.get("status") == "ok" and len(r["times"]) > r["warmup"]]
    return statistics.median(xs) if xs else 0.0


def own_precision(recipe: Recipe) -> str:
    """The precision the recipe runs in on this machine: `auto` as `hasten train` resolves it on
    the recipe's device (bf16-mixed where the GPU or CPU has bf16 hardware, fp32 elsewhere). Choosing it changes
    nothing in the recipe's arithmetic here, so the quality guard has nothing to check."""
    return resolve_precision(recipe.trainer.precision, resolve_device(recipe.trainer.device))


def _default(stage: str, recipe: Recipe) -> str:
    """The label of the option that keeps the recipe's own arithmetic in a guarded stage."""
    mb = recipe.trainer.microbatch
    return {"precision": own_precision(recipe),
            "compile": "eager",
            "optimizer_step": "eager",
            "microbatch": f"whole batch ({recipe.data.batch_size})" if mb is None else f"micro-batches of {mb}",
            }.get(stage, "")


# ---------------------------------------------------------------------------- output
def cache_path(recipe_arg: str, overrides: list[str], recipe: Recipe, min_gain: float = 0.05) -> Path:
    key = json.dumps({"machine": machine_key(), "recipe": to_dict(recipe), "min_gain": min_gain}, sort_keys=True,
                     default=str)
    return data_root() / "tune" / f"{recipe.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _median_of(trial: "Trial", key: str) -> "float | None":
    """The median of `key` over a trial's runs that measured it (None: none did)."""
    values = [r[key] for r in trial.results if r.get("status") == "ok" and r.get(key) is not None]
    return statistics.median(values) if values else None


def data_wait(trial: "Trial") -> "float | None":
    """The median share of a trial's training time spent waiting for batches (None: not measured)."""
    return _median_of(trial, "data_wait")


def loader_cores(trial: "Trial") -> "float | None":
    """The median number of cores a trial's loader workers kept busy while its steps were
    measured (0.0: no worker processes; None: not measured)."""
    return _median_of(trial, "loader_cores")


CACHE_KEYS = {"date": str, "recipe": str, "machine": dict, "table": list, "overrides": list, "tuned_overrides": list}


def read_cache(path: Path) -> "dict | None":
    """A cached search, checked: None when there is none, or (with one warning) when it is not
    a search result this hasten wrote (damaged, cut short, of another layout): it is then
    measured again and the cache rewritten."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        data, why = None, f"unreadable ({type(e).__name__})"
    else:
        bad = [k for k, kind in CACHE_KEYS.items() if not isinstance(data, dict) or not isinstance(data.get(k), kind)]
        why = f"not a search result ({bad[0]} missing or of the wrong type)" if bad else None
    if why is None:
        return data
    warnings.warn(f"hasten tune: the cached result {path} is {why}; measuring again (it will be rewritten)",
                  stacklevel=2)
    return None
