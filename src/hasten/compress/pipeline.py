"""`hasten compress` and `hasten eval` as functions: from a trained run to a compressed,
evaluated and measured artifact.

    result = compress_run("runs/cifar10-fast-...", prune=0.5, finetune="1ep")
    print(result.report_path)

The order is fixed and stated in the report: rebuild the model from the run's recipe (its
model surgery replayed) and load the trained weights; evaluate; structured pruning (a
smaller model rebuilt the same way); unstructured magnitude pruning; fine-tuning on the
recipe's training data with the masks held; masks folded into the weights; quantization;
evaluate again; measure inference cost on this CPU against the uncompressed model; write the
artifact, then the report (markdown and JSON) beside it.

Every evaluation runs in fp32 on the CPU (the report compares like with like), with the
recipe's evaluation procedure (its test-time augmentation included). Fine-tuning trains in
the recipe's `trainer.precision` as `hasten train` resolves it (`auto`: bf16-mixed on a CPU
with bf16 hardware, fp32 elsewhere); `trainer.precision=fp32` among the overrides keeps it in
fp32. It computes each step as the recipe's trainer.* settings say (compile, grad_accum,
microbatch, memory_limit, activation_checkpointing, compile_optimizer, grad_clip_norm).
"""
from __future__ import annotations

import copy
import io
import json
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..allocator import host_allocator_state
from ..assembly import Durations, StepOptions, assemble
from ..build import build_algorithms, step_options
from ..callbacks import ProgressBar
from ..checkpoint import CheckpointIO, load_latest
from ..checkpoint.sharded import load_whole
from ..optim.factory import build_optimizer
from ..checkpoint.format import MODEL_MISMATCH_FIX, model_mismatch, read_meta
from ..config import Recipe, apply_override, parse_override, to_dict, validate
from ..core import Event, Time
from ..data.batches import batch_size, index_batch
from ..errors import CheckpointError, ConfigError, first_line
from ..files import atomic_write
from ..hardware import cpu_has_bf16
from ..optim import LRSchedule
from ..provenance import code_version, describe
from ..runs import is_run_folder, stored_recipe
from ..runtime import make_runtime, resolve_precision
from ..tasks import TASKS
from ..trainer import Trainer
from ..usercode import check_trust, origins_of
from ..algorithms import magnitude_pruning as pruning
from . import outputs, quantize, structured
from .artifact import read_artifact, save_artifact
from .measure import Autocast, best, inference_cost

# recipe algorithms a fine-tune keeps: they shape the loss or the evaluation, not the run's course
FINETUNE_KEEP = {"label_smoothing", "tta", "gradient_clipping"}
# algorithms whose evaluations measure other weights than the model's: compress refuses them
AVERAGED = {"ema", "swa"}


@dataclass
class Session:
    """A recipe's model (surgery replayed), data, metrics and an evaluating Trainer."""
    recipe: Recipe
    trainer: Trainer
    built: object
    algorithms: list = field(default_factory=list)

    @property
    def model(self) -> torch.nn.Module:
        return self.trainer.state.model


def _runtime(recipe: Recipe, device: str = "cpu"):
    t = recipe.trainer
    return make_runtime(device=device, precision="fp32", seed=t.seed, threads=t.threads,
                        host_allocator=t.host_allocator, parallelism="none")   # as hasten train runs it


def with_model_changes(recipe: Recipe, changes: dict) -> Recipe:
    """The recipe with its model section changed (structured pruning's smaller config)."""
    if not changes:
        return recipe
    raw = to_dict(recipe)
    raw["model"] = {**raw["model"], **changes}
    changed = validate({**raw, "name": recipe.name})
    changed.origins = dict(recipe.origins)
    return changed


def open_session(recipe: Recipe, device: str = "cpu") -> Session:
    """Build the recipe's model and data and run its INIT (model surgery) in a Trainer that
    evaluates like the run did."""
    used = {k for k in recipe.algorithms if k in AVERAGED}
    if used:
        raise ConfigError(f"this run evaluates an average of its weights ({', '.join(sorted(used))}); hasten compress "
                          "takes the trained weights themselves, which the run never evaluated: not supported yet")
    spec = TASKS[recipe.task]
    if spec.compress_refusal:
        raise ConfigError(f"hasten compress cannot take a {spec.name} run: {spec.compress_refusal}")
    runtime = _runtime(recipe, device)
    built = spec.make(recipe, runtime)
    algorithms = build_algorithms(recipe)
    trainer = Trainer(model=built.model, train_dataloader=built.train_dataloader, eval_dataloader=built.eval_dataloader,
                      metrics=built.metrics, loss_fn=built.loss_fn, algorithms=algorithms, runtime=runtime,
                      optimizers=[], max_duration=recipe.trainer.max_duration, eval_interval=recipe.trainer.max_duration,
                      log_interval=recipe.trainer.max_duration)
    return Session(recipe=recipe, trainer=trainer, built=built, algorithms=algorithms)


def eval_trainer(model: torch.nn.Module, session: Session, timestamp: dict | None) -> Trainer:
    """A Trainer that evaluates `model` (already changed) with the recipe's evaluation
    algorithms, at the run's clock (so a final-only test-time augmentation applies)."""
    algos = [a for a in session.algorithms if Event.INIT not in a.listens_to()
             and any(e.value.startswith("eval") for e in a.listens_to())]
    t = Trainer(model=model, eval_dataloader=session.built.eval_dataloader, metrics=copy.deepcopy(session.built.metrics),
                loss_fn=session.built.loss_fn, algorithms=algos, runtime=session.trainer.runtime, optimizers=[],
                max_duration=session.recipe.trainer.max_duration)
    if timestamp:
        t.state.timestamp.load_state_dict(timestamp)
    return t


def quality_key(recipe: Recipe) -> tuple[str, str]:
    """(metric, 'max' or 'min'): how the recipe's task judges a run (its TaskSpec's quality)."""
    quality = TASKS[recipe.task].quality
    return quality.metric, quality.direction


def locate(source: "str | Path") -> tuple[Path, Path, "dict | None"]:
    """(run folder, checkpoint, its payload when already read) for a run folder (its newest
    checkpoint, read once: a run still training may remove it next) or a checkpoint inside one."""
    source = Path(source)
    if source.is_dir():
        if not is_run_folder(source):
            raise ConfigError(f"{source} is not a hasten run folder (no recipe.yaml); give the folder "
                              "`hasten train` printed as 'run folder', or one of its checkpoints")
        found = load_latest(source / "checkpoints")
        if found is None:
            raise ConfigError(f"{source} has no checkpoint yet (checkpoints/ is empty): train it first")
        return source, *found
    if not source.exists():
        raise ConfigError(f"{source}: no such run folder or checkpoint")
    run = source.parent.parent if source.parent.name == "checkpoints" else source.parent
    if not is_run_folder(run):
        raise ConfigError(f"{source}: the checkpoint is not inside a run folder, so its recipe is unknown; "
                          "give the run folder")
    return run, source, None


def calibration_batches(session: Session, count: int = 2, max_items: int = 128) -> list[torch.Tensor]:
    """The first `count` training batches' inputs (at most `max_items` each), deterministic.
    Float inputs are rounded to fp16 and back, so that the copy an int8-static artifact
    stores (in fp16) calibrates to the same model when it is loaded."""
    out = []
    for batch in session.built.train_dataloader:
        x, _ = session.trainer.batch_fn(batch)
        x = index_batch(x, torch.arange(min(max_items, batch_size(x))))
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x = x.half().float()   # keeps the memory format (channels-last stays)
        out.append(x)
        if len(out) >= count:
            break
    return out


def load_trained(session: Session, ckpt: Path, payload: "dict | None" = None) -> dict:
    if payload is None or Path(ckpt).is_dir():
        payload = load_whole(ckpt) if Path(ckpt).is_dir() else CheckpointIO().load(ckpt)   # a .dcp: its shards whole
    problem = model_mismatch(session.model, payload["model"])
    if problem:
        raise CheckpointError(f"{ckpt} does not hold this recipe's model ({session.recipe.name}): {problem}; "
                              f"{MODEL_MISMATCH_FIX}")
    try:
        session.model.load_state_dict(payload["model"])
    except (RuntimeError, KeyError) as e:
        raise CheckpointError(f"{ckpt} does not hold this recipe's model ({session.recipe.name}): "
                              f"{(first_line(e) or type(e).__name__)[:200]}") from e
    meta = read_meta(payload, ckpt)
    session.trainer.state.timestamp.load_state_dict(meta.get("timestamp", {}))
    return meta


def finetune_runtime(session: Session):
    """The session's runtime (fp32, for evaluating) with the recipe's training precision, resolved
    on the session's device as `hasten train` resolves it."""
    rt = session.trainer.runtime
    asked = session.recipe.trainer.precision
    return replace(rt, precision=resolve_precision(asked, rt.device), asked_precision=asked)


def step_summary(step) -> str:
    """The step settings that differ from a plain step, for the report ('' if none)."""
    plain = StepOptions()
    return ", ".join(f"{f}={getattr(step, f)}" for f in ("compile", "grad_accum", "microbatch", "memory_limit",
                                                          "activation_checkpointing", "compile_optimizer")
                     if getattr(step, f) != getattr(plain, f))


def finetune(model: torch.nn.Module, session: Session, duration: str, lr_factor: float = 0.1,
             progress: bool = False, timestamp: dict | None = None) -> dict:
    """Train `model` (pruned: its masks hold the zeros) on the recipe's data for `duration`,
    with the recipe's optimizer at `lr_factor` times its learning rates, decaying linearly to
    zero, in the recipe's precision (`finetune_runtime`); the algorithms that shape the loss and
    the evaluation are kept (FINETUNE_KEEP), the others, which belong to the original run's
    course (warm-ups, resizing, averaging), are not. Returns the evaluation at its end, in fp32
    at the run's clock `timestamp` (as `eval_trainer`). `progress`: a ProgressBar (whole lines
    off a terminal)."""
    recipe = session.recipe
    runtime = finetune_runtime(session)
    names = list(recipe.algorithms)
    fresh = build_algorithms(recipe)
    algos = [a for n, a in zip(names, fresh) if n in FINETUNE_KEEP and Event.INIT not in a.listens_to()]

    step = step_options(recipe.trainer)   # the recipe's trainer.* step settings, as hasten train reads them

    def optimizers(m):
        opts = build_optimizer(recipe.optimizer, m, runtime, recipe.data.batch_size,
                               compiled=bool(step.compile_optimizer))
        for o in (opts if isinstance(opts, list) else [opts]):
            for g in o.param_groups:
                g["lr"] *= lr_factor
        return opts

    t = Trainer.from_parts(assemble(
        model, runtime, train_dataloader=session.built.train_dataloader, loss_fn=session.built.loss_fn,
        algorithms=algos, optimizers=optimizers, schedulers=[LRSchedule("linear", min_factor=0.0)],
        callbacks=[ProgressBar()] if progress else [], step=step,
        durations=Durations(max_duration=duration, log_interval=duration)))
    t.fit(summary=False)
    model.eval()
    return eval_trainer(model, session, timestamp).evaluate()


@dataclass
class Result:
    artifact: Path
    report_path: Path
    report: dict


def _tag(prune, scope, structured_ratio, quant, ft, lr_factor=0.1, multiple_of=structured.MULTIPLE_OF) -> str:
    parts = []
    if structured_ratio:
        aligned = f"-x{multiple_of}" if multiple_of != structured.MULTIPLE_OF else ""
        parts.append(f"struct{structured_ratio:g}{aligned}")
    if prune:
        parts.append(f"prune{prune:g}" + ("-layer" if scope == "layer" else ""))
    if quant:
        parts.append(quant)
    if ft:
        parts.append(f"ft{ft}-lr{lr_factor:g}")
    return "-".join(parts) or "dense"


def compress_run(source, prune: float = 0.0, scope: str = "global", structured_ratio: float = 0.0,
                 quant: str | None = None, finetune_for: str | None = None, lr_factor: float = 0.1,
                 out: "str | Path | None" = None, overrides: list[str] = (), export: bool = False,
                 latency: bool = True, repeats: int = 7, device: str = "cpu", log=print,
                 trust_code: bool = False, progress: bool = True,
                 multiple_of: int | None = None) -> Result:
    """Compress the trained model of a run folder (or one of its checkpoints); see the module doc.
    A run whose recipe names code (a user's model or data) is said so before it is imported,
    and refused when the folder is another user's unless `trust_code` (hasten.usercode)."""
    pruning.check_sparsity(prune, "--prune")
    pruning.check_sparsity(structured_ratio, "--structured")
    multiple_of = structured.check_multiple(structured.MULTIPLE_OF if multiple_of is None else multiple_of,
                                            "--multiple-of")
    if scope not in ("global", "layer"):
        raise ConfigError(f"--scope {scope!r}: choose global or layer")
    if quant:
        try:
            quantize.check_mode(quant)
        except (ValueError, ImportError) as e:
            raise ConfigError(str(e)) from None
    if finetune_for:
        try:
            Time.parse(finetune_for)
        except ValueError as e:
            raise ConfigError(f"--finetune {finetune_for!r}: {e}") from None
    run_dir, ckpt, payload = locate(source)
    recipe = stored_recipe(run_dir, list(overrides))
    check_trust(recipe.origins, to_dict(recipe), trust_code, f"compressing {run_dir}", log)
    if trust_code:
        recipe.origins = {}   # the user's word covers this recipe wherever it is built
    tag = _tag(prune, scope, structured_ratio, quant, finetune_for, lr_factor, multiple_of)
    settings = {"checkpoint": str(ckpt.resolve()), "overrides": list(overrides),
                "compression": {"structured": structured_ratio, "prune": prune, "scope": scope, "quantize": quant,
                                "multiple_of": multiple_of if structured_ratio else None, "finetune": finetune_for,
                                "lr_factor": lr_factor if finetune_for else None}}
    files = outputs.plan(run_dir / "compressed", tag, out, export, settings)
    out = files[0]
    log("will write: " + ", ".join(str(p) for p in files))
    t_start = time.perf_counter()
    log(f"rebuilding {recipe.name} from {run_dir} and loading {ckpt.name}")
    session = open_session(recipe, device)
    meta = load_trained(session, ckpt, payload)
    stamp = meta["timestamp"]
    metric, better = quality_key(recipe)
    dense = session.model
    dense.eval()
    before = eval_trainer(dense, session, stamp).evaluate()
    log(f"before: {_fmt(before)}")
    params_before = pruning.count_parameters(dense)
    calib = calibration_batches(session)
    reference = copy.deepcopy(dense)   # the uncompressed model, for the cost comparison
    model, changes, work = dense, {}, session
    steps = []
    if structured_ratio:
        sd, changes = structured.structured_plan(model, structured_ratio, inputs=calib[0], multiple_of=multiple_of)
        work = open_session(with_model_changes(recipe, changes), device)
        work.model.load_state_dict(sd)
        model = work.model
        steps.append(f"structured pruning of {structured_ratio:.0%} of the units per layer"
                     + (f", kept counts of layers of {4 * multiple_of}+ units rounded to multiples of {multiple_of}"
                        if multiple_of > 1 else "") + f" ({changes})")
        log(f"structured: {changes}")
    if prune:
        fn = pruning.global_magnitude_prune if scope == "global" else pruning.layer_magnitude_prune
        fn(model, prune)
        steps.append(f"{scope} magnitude pruning to {prune:.0%} of the prunable weights")
    tuned, ft_record = None, None
    if finetune_for:
        ft_precision = finetune_runtime(work).precision
        ft_step = step_summary(step_options(work.recipe.trainer))
        log(f"fine-tuning for {finetune_for} at {lr_factor:g}x the recipe's learning rates, in {ft_precision}"
            + (f" ({ft_step})" if ft_step else ""))
        t_ft = time.perf_counter()
        tuned = finetune(model, work, finetune_for, lr_factor, progress=progress, timestamp=stamp)
        ft_record = {"precision": ft_precision, "asked_precision": work.recipe.trainer.precision,
                     "step": ft_step or None, "seconds": time.perf_counter() - t_ft}
        steps.append(f"fine-tuning for {finetune_for} at {lr_factor:g}x the learning rates, linear decay to 0, "
                     f"in {ft_precision}" + (f", the recipe's step settings {ft_step}" if ft_step else ""))
    pruning.make_permanent(model)
    model.eval()
    sparsity = pruning.layer_sparsity(model) if prune else {}
    params_after = pruning.count_parameters(model)
    state_dict = model.state_dict()
    final, calibration, static = model, None, None
    if quant == "int8-static":
        final = quantize.quantize_static(model, calib)
        steps.append("int8-static quantization (PT2E, X86InductorQuantizer, calibrated on 2 training batches)")
        static = static_state_checked(final, work, calib[0], log)
        if static is not None:   # the int8 graph's own tensors and numbers; no float weights
            state_dict = {}
        else:   # it did not rebuild alike: the older form, float weights and the batches
            calibration = [c.half() if c.is_floating_point() else c for c in calib]
    elif quant:
        n = quantize.quantize_linear(model, quant)
        state_dict = model.state_dict()
        steps.append(f"{quant} quantization of {n} Linear layers (torchao)")
        if n == 0:
            log("note: no Linear layer was wide enough to quantize; for convolutions use --quantize int8-static")
    if tuned is not None and not quant:
        after = tuned   # the fine-tune's own fp32 evaluation of these weights (masks made permanent: the same)
    else:
        after = eval_trainer(final, work, stamp).evaluate()
    log(f"after:  {_fmt(after)}")
    record = {
        "source": {"run": str(run_dir), "checkpoint": ckpt.name, "recipe": recipe.name, "task": recipe.task},
        "compression": {**settings["compression"], "steps": steps},
        "model_changes": changes, "metric": metric, "better": better,
        "before": before, "after_finetune": tuned, "finetune": ft_record, "after": after,
        "parameters": {"before": params_before[0], "after": params_after[0],
                       "nonzero_before": params_before[1], "nonzero_after": params_after[1]},
        "layer_sparsity": sparsity, "timestamp": stamp,
        "cpu": {"name": quantize.cpu_name(), "int8_hardware": quantize.int8_hardware(),
                "flags": sorted(f for f in quantize.cpu_flags() if f.startswith(("avx", "amx")))},
        "torch": torch.__version__, "threads": torch.get_num_threads(), "code": code_version(),
        "host_allocator": host_allocator_state(),
    }
    if quant:
        record["torchao"] = quantize.require_torchao().__version__
    if quant == "int8-static":
        record["artifact_form"] = "int8 graph" if static is not None else "float weights and calibration batches"
    meta_out = {**record, "recipe": to_dict(recipe), "recipe_name": recipe.name}
    outputs.clear_temporaries(files)
    outputs.claim(files, settings)
    size = save_artifact(out, state_dict, meta_out, calibration, static)
    dense_bytes = _dense_bytes(reference)
    record["bytes"] = {"artifact": size, "dense_fp32": dense_bytes}
    if export:
        record["export"] = export_program(final, calib[0][:2], out.with_suffix(".pt2"))
    if latency:
        record["inference"] = measure_cost(reference, final, work, calib, repeats, log)
    record["seconds"] = time.perf_counter() - t_start
    report_path = out.with_suffix(".md")
    atomic_write(out.with_suffix(".json"), lambda f: json.dump(record, f, indent=1, default=str), binary=False)
    atomic_write(report_path, lambda f: f.write(render(record)), binary=False)
    outputs.record(files, settings)
    return Result(artifact=out, report_path=report_path, report=record)


def _fmt(metrics: dict) -> str:
    return "  ".join(f"{k}={v:.4f}" for k, v in metrics.items())


def _dense_bytes(model) -> int:
    buf = io.BytesIO()
    torch.save({k: v.detach().float() for k, v in model.state_dict().items()}, buf)
    return buf.tell()


def export_program(model, example, path: Path) -> dict:
    """torch.export the compressed model to `path` (for use without hasten), or say why not."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            batch = torch.export.Dim("batch", min=1)
            program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},), strict=False)
            atomic_write(path, lambda f: torch.export.save(program, f))
        return {"path": path.name, "bytes": path.stat().st_size}
    except Exception as e:
        return {"error": f"torch.export does not support this model: {type(e).__name__}: {first_line(e)[:200]}"}


BF16_REFERENCE = "before-bf16"


def measure_cost(reference, final, session: Session, calib, repeats: int, log) -> list:
    """CPU inference time of the model before and after, at batch sizes 1, 64 and the recipe's
    evaluation batch, on inputs the task makes (TaskSpec.example_inputs). On a CPU with bf16
    hardware the model before is also timed under bf16 autocast (rows of `BF16_REFERENCE`)."""
    recipe = session.recipe
    batches = sorted({1, 64, recipe.data.eval_batch_size})
    make_inputs = TASKS[recipe.task].example_inputs
    models = {"before": reference, "after": final}
    if cpu_has_bf16():   # the float path this CPU offers besides fp32: the dense model under bf16 autocast
        models[BF16_REFERENCE] = Autocast(reference)
    log(f"measuring CPU inference at batches {batches} ({repeats} interleaved runs each, eager and compiled; "
        f"{', '.join(models)})")
    return inference_cost(models, lambda b: make_inputs(session.built, b), batches, repeats=repeats)


def render(r: dict) -> str:
    """The compression report as markdown."""
    m = r["metric"]
    b, a = r["before"].get(m), r["after"].get(m)
    lines = [f"# Compression report: {r['source']['recipe']} ({r['source']['checkpoint']})", "",
             "Steps, in order: " + ("; ".join(r["compression"]["steps"]) or "none") + ".", "",
             "| | before | after |", "|---|---|---|",
             f"| {m} | {b:.4f} | {a:.4f} ({a - b:+.4f}) |"]
    if r.get("after_finetune"):
        lines.append(f"| {m} at the end of fine-tuning, before quantization | | {r['after_finetune'].get(m, float('nan')):.4f} |")
    p = r["parameters"]
    lines += [f"| parameters | {p['before']:,} | {p['after']:,} |",
              f"| non-zero parameters | {p['nonzero_before']:,} | {p['nonzero_after']:,} |",
              f"| bytes on disk | {r['bytes']['dense_fp32']:,} (fp32 state dict) | {r['bytes']['artifact']:,} (artifact) |"]
    if r.get("export"):
        e = r["export"]
        lines.append(f"| torch.export program | | {e.get('bytes', 0):,} bytes ({e.get('path')}) |" if "bytes" in e else f"| torch.export | | {e['error']} |")
    if r.get("inference"):
        rows = r["inference"]
        fastest = best(rows)
        lines += ["", f"CPU inference ({r['cpu']['name']}; int8 hardware: {r['cpu']['int8_hardware']}; "
                  f"{r['threads']} threads; torch {r['torch']}): median of interleaved runs, eager and compiled "
                  "(inductor with freezing) both measured, the faster one used for the ratio.", ""]
        bf16 = any(x["model"] == BF16_REFERENCE for x in rows)
        columns = [("before", "eager"), ("before", "compiled")] \
            + ([(BF16_REFERENCE, "eager"), (BF16_REFERENCE, "compiled")] if bf16 else []) \
            + [("after", "eager"), ("after", "compiled")]
        names = {"before": "before", BF16_REFERENCE: "before in bf16", "after": "after"}
        lines += ["| batch | " + " | ".join(f"{names[m]}: {p}" for m, p in columns) + " | speedup (best vs best) |"
                  + (" speedup vs bf16 (best vs best) |" if bf16 else ""),
                  "|---|" + "---|" * (len(columns) + 1 + bf16)]
        for batch in sorted({x["batch"] for x in rows}):
            cell = {}
            for x in rows:
                if x["batch"] == batch:
                    cell[(x["model"], x["path"])] = f"{x['per_item_ms']:.3f} ms/item" if "median_s" in x else "fails"
            ratios = []
            for ref in ("before",) + ((BF16_REFERENCE,) if bf16 else ()):
                fb, fa = fastest.get((ref, batch)), fastest.get(("after", batch))
                ratios.append(f"{fb['median_s'] / fa['median_s']:.2f}x" if fb and fa else "-")
            lines.append(f"| {batch} | " + " | ".join(cell.get(c, "-") for c in columns) + " | "
                         + " | ".join(ratios) + " |")
        if bf16:
            lines += ["", "\"before in bf16\" is the model before, run under bf16 autocast (this CPU computes bf16 in "
                      "hardware): timed only; the quality above is fp32's."]
    if r["compression"]["quantize"] == "int8-static":
        if r.get("artifact_form") == "float weights and calibration batches":
            lines += ["", "This int8-static artifact holds float weights and its calibration batches (fp16) and is "
                      "re-quantized when loaded: the int8 graph did not rebuild alike from the recipe's model here."]
        else:
            lines += ["", "The int8-static artifact holds the int8 graph's weights, scales and biases and the "
                      "activations' quantization parameters; loading builds the same graph from the recipe's model "
                      "and puts them back. --export writes the int8 program itself, for use without hasten."]
    lines += ["", f"CPU flags: {', '.join(r['cpu']['flags'])}."]
    if r.get("finetune"):   # older reports do not say; they fine-tuned in fp32
        ft = r["finetune"]
        how = f", step settings {ft['step']}" if ft.get("step") else ""
        lines += [f"Fine-tuning trained in {ft['precision']} (trainer.precision: {ft['asked_precision']}{how}) "
                  f"for {ft['seconds']:.1f} s; every evaluation ran in fp32."]
    if r.get("host_allocator"):   # older reports do not say; they ran under glibc's defaults
        lines += [f"The process's {r['host_allocator'][0].lower()}{r['host_allocator'][1:]}."]
    lines += [f"Code: {describe(r['code'])}.", ""]
    return "\n".join(lines)


def static_state_checked(final, session: Session, example, log) -> dict | None:
    """The int8-static graph's state (quantize.static_state) when a graph rebuilt from the
    recipe's model with it computes exactly what `final` does; else None (the artifact then
    takes the older form: float weights and the calibration batches)."""
    state = quantize.static_state(final)
    try:
        fresh = copy.deepcopy(session.model).eval()
        rebuilt = quantize.quantize_static_from(fresh, TASKS[session.recipe.task].example_inputs(session.built, 2), state)
        x = index_batch(example, torch.arange(min(8, batch_size(example))))
        with torch.no_grad():
            same = torch.equal(rebuilt(x), final(x))
    except (ValueError, RuntimeError) as e:
        same, why = False, first_line(e)[:200]
    else:
        why = "its outputs differ"
    if same:
        return state
    log(f"note: the int8 graph did not rebuild alike from the recipe's model ({why}); the artifact stores the float "
        "weights and the calibration batches instead")
    return None


# ---------------------------------------------------------------------------- loading artifacts
def load_artifact(path, overrides: list[str] = (), device: str = "cpu",
                  trust_code: bool = False) -> tuple[torch.nn.Module, Session, dict]:
    """(model, session, meta) of an artifact: the recipe's model (its surgery replayed, the
    smaller config of structured pruning), its weights, its quantization re-applied. Code the
    recipe names is imported only as hasten.usercode.check_trust allows."""
    weights, meta, static = read_artifact(path)
    raw = dict(meta["recipe"])
    check_trust(path, raw, trust_code, f"loading {path}")
    for text in overrides:
        keys, value = parse_override(text)
        apply_override(raw, keys, value)
    recipe = with_model_changes(validate({**raw, "name": meta.get("recipe_name", "artifact")}), meta.get("model_changes") or {})
    recipe.origins = {} if trust_code else origins_of(raw, str(path))   # the artifact names the code it imports
    session = open_session(recipe, device)
    model = session.model
    pruning.make_permanent(model)   # a recipe with gradual pruning adds masks at INIT: the artifact's weights are final
    quant = (meta.get("compression") or {}).get("quantize")
    if quant == "int8-static" and static and "tensors" in static:   # the int8 graph's own numbers, no float weights
        model.eval()
        try:
            model = quantize.quantize_static_from(model, TASKS[recipe.task].example_inputs(session.built, 2), static)
        except (ValueError, RuntimeError) as e:
            raise CheckpointError(f"{path}: its int8 graph does not fit the graph its recipe's model quantizes to "
                                  f"here ({first_line(e)[:200]}); load it with the torch and torchao that wrote it "
                                  f"(torch {meta.get('torch', '?')}, torchao {meta.get('torchao', '?')}), or use the "
                                  "program --export wrote") from e
        return model, session, meta
    try:
        if quant in ("int8", "int8-weight"):
            quantize.require_torchao()
            model.load_state_dict(weights, assign=True)
        else:
            model.load_state_dict(weights)
    except (RuntimeError, KeyError) as e:
        raise CheckpointError(f"{path}: its weights do not fit the model its recipe builds: "
                              f"{first_line(e)[:200]}") from e
    model.eval()
    if quant == "int8-static":   # the older form: float weights, re-quantized on the stored batches
        calibration = (static or {}).get("calibration") or []
        model = quantize.quantize_static(model, [c.float() if c.is_floating_point() else c for c in calibration])
    return model, session, meta


def evaluate_artifact(path, overrides: list[str] = (), device: str = "cpu", trust_code: bool = False,
                      announce=None) -> dict:
    """The artifact's metrics on its recipe's evaluation data; `announce()` is called once the
    artifact is read and checked, before the evaluation runs."""
    model, session, meta = load_artifact(path, overrides, device, trust_code)
    if announce is not None:
        announce()
    return eval_trainer(model, session, meta.get("timestamp")).evaluate()


__all__ = ["FINETUNE_KEEP", "Result", "Session", "compress_run", "evaluate_artifact", "finetune", "load_artifact",
           "open_session", "render"]
