"""hasten, the Hugging Face Trainer and Lightning on the same model, side by side.

Each arm trains the same model on the same data; one evaluator (the same function, in fp32,
on the same held-out data) scores every arm at the same cadence, with the clock stopped
while it runs, so the arms differ only in how they train. Every run is its own process;
seeds are interleaved (seed 0 of every arm, then seed 1, ...); a stopped comparison
continues where it stopped. The statistics and report are `hasten bench`'s (time to target
with misses counted, Kaplan-Meier median ratios with bootstrap intervals, Welch's t on the
final metric); the target is the first arm's worst final value, so every run of the
trainer the user would pick reaches it.

    python -m benchmarks.comparisons.vs_trainers gpt   [--seeds 3] [--steps 500] [--fast-steps 300]
    python -m benchmarks.comparisons.vs_trainers cifar [--seeds 3] [--epochs 10]

Equal terms: every arm's process starts with the same environment, which holds hasten's host
allocator settings as glibc's MALLOC_* variables (a one-line `export` a user of any trainer
can write; hasten leaves the allocator alone when they are set), except the arms marked "as
documented", which run under glibc's defaults as the host's documentation leaves them. The
first arm of each suite is the host with the one-line change a user makes without hasten, so
every ratio in the report is what hasten adds over that.

gpt: a GPT-2 (`transformers.GPT2LMHeadModel`, 4 layers of width 256, 4 heads, dropout 0,
the 8,192-token BPE vocabulary of the prose corpus, windows of 256, batch 16) on the prose
corpus of docs/model-families.md. Arms:
- `hf`: the HF `Trainer` with its documented settings for speed on this machine (written in
  the report): bf16 where the CPU has bf16 hardware, the fused AdamW, and nanoGPT's
  hyperparameters (the baseline recipe's: lr 1e-3, betas 0.9/0.99, weight decay 0.1,
  clipping 1.0, cosine with warm-up), plus the allocator settings (equal terms);
- `hf-documented`: the same under glibc's allocator defaults (as documented; not like for like);
- `hasten`: the same model in hasten's Trainer with `prose-gpt-baseline` (fp32, as nanoGPT runs a CPU);
- `hasten-fast`: the same model with `prose-gpt-fast`'s training (bf16 where the CPU has it,
  Muon on the matrices, the warm-up/stable/decay schedule, fewer steps);
- `hf+hasten`: the HF Trainer running that training through `HastenTrainer` (Muon through
  `muon_optimizer`, the WSD schedule, bf16).

cifar: the `cifar10-narrow` network (16/48/48) on the CIFAR-10 copy for 10 epochs. Arms:
- `lightning-cl`: a LightningModule with Lightning's recommended settings for this machine
  (written in the report): bf16-mixed where the CPU has bf16 hardware, a DataLoader with
  workers and per-sample random crops and flips, SGD with Nesterov momentum, one-cycle-like
  linear schedule, cross-entropy; and the network and its inputs in channels-last (the
  one-line change a Lightning user makes without hasten);
- `lightning`: the same without channels-last (as Lightning's documentation leaves it);
- `hasten`: the same network and training in hasten's Trainer with the same DataLoader
  pipeline (no hasten methods);
- `hasten-fast`: `cifar10-narrow` as packaged (device-resident loader, patch whitening,
  channels-last, label smoothing, TTA);
- `lightning+hasten`: the Lightning module with `HastenCallback` running the methods that
  work in Lightning (channels-last, label smoothing; patch whitening fitted before training
  with its functional form; TTA through `tta_logits` in the evaluator is not used, so that one
  evaluator scores every arm).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.tools.common import glibc_env, hasten_malloc, result_folder  # noqa: E402

from hasten.bench.report import write_report  # noqa: E402
from hasten.bench.runner import COUNTED, read_worker_output, load_runs, outcome  # noqa: E402
from hasten.bench.target import Target  # noqa: E402
from hasten.bench.recording import machine  # noqa: E402
from hasten.hardware import cpu_has_bf16  # noqa: E402
from hasten.provenance import code_version, run_provenance  # noqa: E402

ARMS = {"gpt": ["hf", "hf-documented", "hasten", "hasten-fast", "hf+hasten"],
        "cifar": ["lightning-cl", "lightning", "hasten", "hasten-fast", "lightning+hasten"],
        "resnet": ["lightning-cl", "hasten", "hasten-tuned", "hasten-methods"]}
AS_DOCUMENTED = {"hf-documented"}   # arms under glibc's allocator defaults; every other arm under hasten's settings
GPT = dict(n_layer=4, n_head=4, n_embd=256, n_positions=256, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
BLOCK, BATCH, EVAL_TOKENS = 256, 16, 131072


def bf16_hardware() -> bool:
    return cpu_has_bf16() or torch.cuda.is_available()


# ---------------------------------------------------------------------------- the clock and the evaluator
class Clock:
    """Training time with evaluations taken out: `train_s` at an evaluation point is the wall
    time since the start minus every evaluation so far (the same rule for every arm)."""

    def __init__(self, out, evaluate, metric: str):
        self.out, self.evaluate, self.metric = out, evaluate, metric
        self.t0 = None
        self.eval_s = 0.0
        self.last = {}
        self.train_s = 0.0

    def start(self):
        self.t0 = time.perf_counter()

    def point(self, model, step: int, samples: int, tokens: int = 0):
        t = time.perf_counter()
        self.train_s = t - self.t0 - self.eval_s
        was = model.training
        model.eval()
        with torch.no_grad():
            value = self.evaluate(model)
        model.train(was)
        dt = time.perf_counter() - t
        self.eval_s += dt
        self.last = {self.metric: value}
        self.out.write(json.dumps({"kind": "eval", "train_s": self.train_s, "batch": step, "sample": samples,
                                   "token": tokens, "eval_s": dt, "metrics": self.last, "method_setup_s": 0.0}) + "\n")
        self.out.flush()

    def final(self, step: int, samples: int, tokens: int, extra: dict) -> None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.out.write(json.dumps({
            "kind": "final", "metrics": self.last, "batch": step, "sample": samples, "token": tokens,
            "train_s": self.train_s, "warmup_s": 0.0, "eval_s": self.eval_s, "data_setup_s": 0.0,
            "method_setup_s": 0.0, "fit_wall_s": time.perf_counter() - self.t0, "total_wall_s": None,
            "peak_memory_bytes": peak, "stop_reason": None, "device": "cpu", "machine": machine(), "world_size": 1,
            "code": code_version(), **extra}) + "\n")
        self.out.flush()


def clock_points(clock: Clock, due, model=None):
    """A hasten callback that starts `clock` with the fit and scores the model at every batch
    for which `due(batch)` holds (`model`: what to score, default the state's model)."""
    from hasten.core import Callback

    class ClockPoints(Callback):
        def fit_start(self, state, logger):
            clock.start()

        def batch_end(self, state, logger):
            ts = state.timestamp
            if due(ts.batch):
                clock.point(model if model is not None else state.model, ts.batch, ts.sample, ts.token)

    return ClockPoints()


def accuracy_on(test_x, test_y):
    """The image arms' evaluator: top-1 accuracy on (test_x, test_y), 1,000 images at a time."""
    def evaluate(model):
        correct = 0
        for i in range(0, len(test_x), 1000):
            correct += (model(test_x[i:i + 1000]).argmax(1) == test_y[i:i + 1000]).sum().item()
        return correct / len(test_y)
    return evaluate


def lightning_fit(module, loader, clock: Clock, *, epochs: int, every: int, batch: int, precision: str, seed: int,
                  callbacks=()):
    """A Lightning arm's fit: `clock` started with training and scored every `every` epochs,
    Lightning's Trainer on the CPU with nothing beyond `callbacks` (no logger, checkpoints,
    progress bar or sanity check); returns the Trainer."""
    import lightning as L

    class Points(L.Callback):
        def on_train_start(self, trainer, module):
            clock.start()

        def on_train_epoch_end(self, trainer, module):
            if (trainer.current_epoch + 1) % every == 0:
                clock.point(module, trainer.global_step, trainer.global_step * batch)

    L.seed_everything(seed, verbose=False)
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, precision=precision, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[*callbacks, Points()], num_sanity_val_steps=0)
    trainer.fit(module, loader)
    return trainer


# ---------------------------------------------------------------------------- gpt
def gpt_data():
    from hasten.data.corpus import tokenized_corpus
    c = tokenized_corpus("prose", "text", 10, 8192, None)
    as_tensor = (lambda t: torch.as_tensor(np.asarray(t).astype(np.int64)))
    return as_tensor(c.train_tokens), as_tensor(c.val_tokens[:EVAL_TOKENS + 1]), c.tokenizer.vocab_size


def gpt_evaluator(val):
    n = (len(val) - 1) // BLOCK
    x = val[: n * BLOCK].view(n, BLOCK).long()
    y = val[1: n * BLOCK + 1].view(n, BLOCK).long()

    def evaluate(model):
        total = 0.0
        for i in range(0, n, 32):
            logits = model(input_ids=x[i:i + 32]).logits
            total += F.cross_entropy(logits.float().flatten(0, 1), y[i:i + 32].flatten(), reduction="sum").item()
        return total / y.numel()
    return evaluate


def gpt_model(vocab: int, seed: int):
    import transformers
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=vocab, bos_token_id=0, eos_token_id=0,
                                                                **GPT))


class RandomWindowSet(torch.utils.data.Dataset):
    """Random training windows for the HF Trainer: item i is the window at a start drawn from
    a generator seeded by (seed, i), so every epoch of the sampler sees fresh windows."""

    def __init__(self, tokens, n, seed):
        self.tokens, self.n, self.seed = tokens, n, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        s = int(torch.randint(0, len(self.tokens) - BLOCK - 1, (1,), generator=g))
        w = self.tokens[s: s + BLOCK].long()
        return {"input_ids": w, "labels": w}


def hf_arguments(out_dir, steps, seed, fast: bool):
    import transformers
    kw = dict(output_dir=out_dir, per_device_train_batch_size=BATCH, max_steps=steps, seed=seed, data_seed=seed,
              logging_steps=50, report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=not torch.cuda.is_available(),
              bf16=bf16_hardware(), optim="adamw_torch_fused", dataloader_num_workers=0, weight_decay=0.1,
              max_grad_norm=1.0, adam_beta1=0.9)
    if fast:   # prose-gpt-fast's schedule; Muon comes in through optimizers=
        kw.update(lr_scheduler_type="warmup_stable_decay", warmup_steps=int(0.05 * steps),
                  lr_scheduler_kwargs={"num_decay_steps": int(0.4 * steps)}, learning_rate=6e-3, adam_beta2=0.95)
    else:      # prose-gpt-baseline's (nanoGPT's) hyperparameters
        kw.update(lr_scheduler_type="cosine_with_min_lr", warmup_steps=25, lr_scheduler_kwargs={"min_lr": 1e-4},
                  learning_rate=1e-3, adam_beta2=0.99)
    return transformers.TrainingArguments(**kw)


def hf_trainer(model, args, data, callbacks, hasten: bool):
    """The `hf` arm's `transformers.Trainer`, or with `hasten` the `hf+hasten` arm's
    HastenTrainer with hasten's Muon (prose-gpt-fast's rates; the schedule is in `args`)."""
    import transformers
    if not hasten:
        return transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    from hasten.integrations.hf import HastenTrainer, muon_optimizer
    opt = muon_optimizer(model, muon_lr=0.03, adam_lr=6e-3, adam_betas=(0.9, 0.95), adam_weight_decay=0.1,
                         precision="bf16-mixed" if args.bf16 else "fp32")
    return HastenTrainer(model=model, args=args, train_dataset=data, callbacks=callbacks, optimizers=(opt, None))


def run_gpt(arm: str, seed: int, out, steps: int, fast_steps: int, every: int):
    import transformers
    train, val, vocab = gpt_data()
    clock = Clock(out, gpt_evaluator(val), "val/loss")
    extra = {}
    if arm in ("hf", "hf-documented", "hf+hasten"):
        fast = arm == "hf+hasten"
        n_steps = fast_steps if fast else steps
        model = gpt_model(vocab, seed)
        args = hf_arguments(tempfile.mkdtemp(prefix="hf-"), n_steps, seed, fast)
        extra["training_arguments"] = {k: v for k, v in args.to_dict().items()
                                       if k in ("per_device_train_batch_size", "max_steps", "learning_rate", "bf16",
                                                "optim", "dataloader_num_workers", "weight_decay", "max_grad_norm",
                                                "adam_beta1", "adam_beta2", "lr_scheduler_type", "lr_scheduler_kwargs",
                                                "warmup_steps", "torch_compile", "seed")}

        class Points(transformers.TrainerCallback):
            def on_train_begin(self, a, state, control, **kw):
                clock.start()

            def on_step_end(self, a, state, control, **kw):
                if state.global_step % every == 0 or state.global_step == n_steps:
                    clock.point(model, state.global_step, state.global_step * BATCH, state.global_step * BATCH * BLOCK)

        hf_trainer(model, args, RandomWindowSet(train, n_steps * BATCH, seed), [Points()], fast).train()
        clock.final(n_steps, n_steps * BATCH, n_steps * BATCH * BLOCK, extra)
        return
    # hasten's Trainer, from the recipes, with the HF model
    from hasten.build import build_run
    from hasten.config import load_recipe
    recipe_name = "prose-gpt-fast" if arm == "hasten-fast" else "prose-gpt-baseline"
    n_steps = fast_steps if arm == "hasten-fast" else steps
    model_section = "{name: hf/gpt2, " + ", ".join(f"{k}: {v}" for k, v in GPT.items()) + "}"
    overrides = [f"model={model_section}", f"trainer.max_duration={n_steps}ba", f"trainer.eval_interval={n_steps}ba",
                 f"trainer.seed={seed}", f"trainer.run_dir={tempfile.mkdtemp(prefix='hasten-')}/run",
                 "trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.checkpoints=false",
                 "data.eval_tokens=4096"]
    recipe = load_recipe(recipe_name, overrides)
    run = build_run(recipe, progress_bar=False, console_logger=False)
    inner = run.trainer.state.model.model   # the transformers model inside hasten's adapter
    extra["recipe"] = recipe_name
    extra["overrides"] = overrides[:3]

    run.trainer.add_callbacks(clock_points(clock, lambda b: b % every == 0 or b == n_steps, inner))
    run.trainer.fit(summary=False)
    run.close()
    ts = run.trainer.state.timestamp
    clock.final(ts.batch, ts.sample, ts.token, extra)


# ---------------------------------------------------------------------------- cifar
CIFAR_BATCH, CIFAR_LR, CIFAR_WD = 256, 0.4, 5e-4


def cifar_net(seed: int):
    from hasten.models import SpeedrunNet
    torch.manual_seed(seed)
    return SpeedrunNet(num_classes=10, widths=(16, 48, 48))


def cifar_pipeline(data, seed: int):
    """What a user writes for a CPU (and both plain arms get): a DataLoader with worker
    processes, per-sample random crops (padding 4) and flips, normalised images."""
    from hasten.data.cifar import MEAN, STD
    from hasten.data.loaders import TensorPairs, make_dataloader
    from hasten.data.transforms import RandomCropFlip
    return make_dataloader(TensorPairs(data.train_x, data.train_y), CIFAR_BATCH, shuffle=True, seed=seed,
                           transform=RandomCropFlip(MEAN, STD, pad=4, flip=True), num_workers=1, drop_last=False)


def cifar_optimizer(model, steps_per_epoch: int, epochs: int):
    """SGD with Nesterov momentum, linear warm-up over one epoch and linear decay to zero, per step."""
    opt = torch.optim.SGD(model.parameters(), lr=CIFAR_LR, momentum=0.9, nesterov=True, weight_decay=CIFAR_WD)
    total, warm = steps_per_epoch * epochs, steps_per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (total - s) / (total - warm)))
    return opt, sched


def run_cifar(arm: str, seed: int, out, epochs: int, every: int, data_path: str | None):
    from hasten.data.cifar import MEAN, STD, load_cifar10
    from hasten.data.transforms import Normalize
    data = load_cifar10(data_path)
    if os.environ.get("VS_TRAINERS_SUBSET"):   # smoke tests of this script: a slice of the training set
        n = int(os.environ["VS_TRAINERS_SUBSET"])
        data.train_x, data.train_y = data.train_x[:n], data.train_y[:n]
    norm = Normalize(MEAN, STD)
    test_x = torch.stack([norm(x) for x in data.test_x]).contiguous(memory_format=torch.channels_last)
    test_y = data.test_y
    precision = "bf16-mixed" if bf16_hardware() else "fp32"

    clock = Clock(out, accuracy_on(test_x, test_y), "val/acc")
    extra = {"precision": precision}
    if arm.startswith("lightning"):
        import lightning as L
        net = cifar_net(seed)
        algorithms = []
        if arm == "lightning+hasten":
            from hasten.algorithms import ChannelsLast, LabelSmoothing
            from hasten.functional import fit_patch_whitening
            images = torch.stack([norm(x) for x in data.train_x[:5000]])
            fit_patch_whitening(net.whiten, images, 5e-4, negate=True)
            net.whiten.weight.requires_grad_(False)
            algorithms = [ChannelsLast(), LabelSmoothing(0.2)]
        loader = cifar_pipeline(data, seed)
        steps_per_epoch = len(loader)

        channels_last = arm == "lightning-cl"   # the one-line change: network and inputs in channels-last
        if channels_last:
            net = net.to(memory_format=torch.channels_last)

        class Module(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.net, self.loss_fn = net, F.cross_entropy

            def forward(self, x):
                return self.net(x.contiguous(memory_format=torch.channels_last) if channels_last else x)

            def training_step(self, batch, i):
                x, y = batch
                return self.loss_fn(self(x), y)

            def configure_optimizers(self):
                opt, sched = cifar_optimizer(self, steps_per_epoch, epochs)
                return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        callbacks = []
        if algorithms:
            from hasten.integrations.lightning import HastenCallback
            callbacks.append(HastenCallback(algorithms, seed=seed))
        extra["lightning"] = {"precision": precision, "num_workers": 1, "persistent_workers": True,
                              "compile": False, "channels_last": channels_last,
                              "algorithms": [a.name for a in algorithms]}
        trainer = lightning_fit(Module(), loader, clock, epochs=epochs, every=every, batch=CIFAR_BATCH,
                                precision=precision, seed=seed, callbacks=callbacks)
        clock.final(trainer.global_step, trainer.global_step * CIFAR_BATCH, 0, extra)
        return
    if arm == "hasten":   # the Lightning arm's network, pipeline and training in hasten's Trainer
        from hasten import Trainer
        net = cifar_net(seed)
        loader = cifar_pipeline(data, seed)
        steps_per_epoch = len(loader)
        points = clock_points(clock, lambda b: b % (every * steps_per_epoch) == 0)
        opt, sched = cifar_optimizer(net, steps_per_epoch, epochs)
        trainer = Trainer(net, loader, optimizers=opt, schedulers=sched, max_duration=f"{epochs}ep", seed=seed,
                          precision=precision, callbacks=[points], host_allocator="auto")
        trainer.fit(summary=False)
        ts = trainer.state.timestamp
        clock.final(ts.batch, ts.sample, 0, extra)
        return
    # hasten-fast: cifar10-narrow as packaged, for the same epochs
    from hasten.build import build_run
    from hasten.config import load_recipe
    overrides = [f"trainer.max_duration={epochs}ep", f"trainer.eval_interval={epochs}ep", "schedule.warmup=1ep",
                 f"trainer.seed={seed}", f"trainer.run_dir={tempfile.mkdtemp(prefix='hasten-')}/run",
                 "trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.checkpoints=false",
                 f"trainer.precision={precision}"]
    if data_path:
        overrides.append(f"data.path={data_path}")
    run = build_run(load_recipe("cifar10-narrow", overrides), progress_bar=False, console_logger=False)
    steps_per_epoch = len(run.trainer.state.train_dataloader)
    run.trainer.add_callbacks(clock_points(clock, lambda b: b % (every * steps_per_epoch) == 0))
    run.trainer.fit(summary=False)
    run.close()
    ts = run.trainer.state.timestamp
    clock.final(ts.batch, ts.sample, 0, {**extra, "recipe": "cifar10-narrow", "overrides": overrides[:3]})


# ---------------------------------------------------------------------------- resnet: a user's own model
RESNET_RECIPE = Path(__file__).parent / "recipes" / "user-resnet.yaml"


def run_resnet(arm: str, seed: int, out, epochs: int, every: int, data_path: str | None, tuned: str | None,
               methods: str | None = None):
    """The user's ResNet and data (user_resnet.py) in plain Lightning with the two flags a user
    sets by hand (bf16-mixed where the CPU has bf16 hardware, channels-last), against hasten's
    recipe of it as written (`hasten`), as `hasten tune` handed it over (`hasten-tuned`, the
    tuned.yaml given by --recipe), and with a method on top (`hasten-methods`, --methods-recipe)."""
    from benchmarks.comparisons.user_resnet import ResNet, loaders
    from hasten.config import load_recipe
    written = load_recipe(str(RESNET_RECIPE))
    train_set, test = loaders(data_path, **{k: v for k, v in written.data.factory_args.items() if k != "path"})
    test_x, test_y = test.tensors
    batch, lr, wd = written.data.batch_size, written.optimizer.lr, written.optimizer.weight_decay

    clock = Clock(out, accuracy_on(test_x, test_y), "val/acc")
    precision = "bf16-mixed" if bf16_hardware() else "fp32"
    if arm == "lightning-cl":
        import lightning as L
        torch.manual_seed(seed)
        net = ResNet(**written.model.args).to(memory_format=torch.channels_last)
        loader = torch.utils.data.DataLoader(train_set, batch_size=batch, shuffle=True, num_workers=1,
                                             persistent_workers=True)
        steps_per_epoch = len(loader)

        class Module(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, x):
                return self.net(x.contiguous(memory_format=torch.channels_last))

            def training_step(self, b, i):
                return F.cross_entropy(self(b[0]), b[1])

            def configure_optimizers(self):   # SGD with Nesterov momentum; a warm-up epoch, then cosine to zero
                opt = torch.optim.SGD(self.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=wd)
                total, warm = steps_per_epoch * epochs, steps_per_epoch
                f = lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm)))
                return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, f),
                                                           "interval": "step"}}

        trainer = lightning_fit(Module(), loader, clock, epochs=epochs, every=every, batch=batch,
                                precision=precision, seed=seed)
        clock.final(trainer.global_step, trainer.global_step * batch, 0,
                    {"precision": precision, "lightning": {"precision": precision, "channels_last": True, "num_workers": 1}})
        return
    from hasten.build import build_run
    recipe = {"hasten": str(RESNET_RECIPE), "hasten-tuned": tuned, "hasten-methods": methods}[arm]
    if not recipe:
        raise SystemExit(f"vs_trainers resnet: the {arm} arm needs its recipe (--recipe, --methods-recipe)")
    r = load_recipe(recipe)
    if "ema" in r.algorithms:
        raise SystemExit("vs_trainers resnet: the clock scores the trained weights; a recipe with EMA needs its average scored")
    duration = f"{epochs}ep" if arm == "hasten" else r.trainer.max_duration
    overrides = [f"trainer.max_duration={duration}", f"trainer.eval_interval={duration}",   # hasten's own evaluation
                 f"trainer.seed={seed}",                                                   # once, after the clock's last point
                 f"trainer.run_dir={tempfile.mkdtemp(prefix='hasten-')}/run", "trainer.progress_bar=false",
                 "trainer.tensorboard=false", "trainer.checkpoints=false"]
    if data_path:
        overrides.append(f"data.factory_args.path={data_path}")
    run = build_run(load_recipe(recipe, overrides), progress_bar=False, console_logger=False)
    steps_per_epoch = len(run.trainer.state.train_dataloader)
    run.trainer.add_callbacks(clock_points(clock, lambda b: b % (every * steps_per_epoch) == 0))
    run.trainer.fit(summary=False)
    run.close()
    ts = run.trainer.state.timestamp
    if ts.batch % (every * steps_per_epoch):   # a shorter tuned run: score its end too
        clock.point(run.trainer.state.model, ts.batch, ts.sample)
    clock.final(ts.batch, ts.sample, 0, {"precision": r.trainer.precision, "recipe": recipe, "overrides": overrides[:1]})


# ---------------------------------------------------------------------------- orchestration
def run_child(args) -> int:
    with open(args.out_file, "a") as out:
        if args.suite == "gpt":
            run_gpt(args.arm, args.seed, out, args.steps, args.fast_steps, args.every)
        elif args.suite == "resnet":
            run_resnet(args.arm, args.seed, out, args.epochs, args.every, args.data, args.recipe, args.methods_recipe)
        else:
            run_cifar(args.arm, args.seed, out, args.epochs, args.every, args.data)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("suite", choices=sorted(ARMS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=500, help="gpt: steps of the hf and hasten arms")
    p.add_argument("--fast-steps", type=int, default=300, help="gpt: steps of the two fast arms")
    p.add_argument("--epochs", type=int, default=10, help="cifar: epochs of every arm")
    p.add_argument("--every", type=int, default=50, help="evaluate every N steps (gpt) or epochs (cifar)")
    p.add_argument("--data", default=None, help="cifar: the CIFAR-10 archive or folder (default: downloaded)")
    p.add_argument("--arms", default=None, help="comma-separated subset of the arms")
    p.add_argument("--recipe", default=None, help="resnet: the tuned recipe of the hasten-tuned arm (tune's tuned.yaml)")
    p.add_argument("--methods-recipe", default=None, help="resnet: the recipe of the hasten-methods arm")
    p.add_argument("--name", default=None)
    p.add_argument("--child", nargs=3, metavar=("ARM", "SEED", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.arm, args.seed, args.out_file = args.child[0], int(args.child[1]), args.child[2]
        return run_child(args)
    if args.suite in ("cifar", "resnet") and args.epochs < 2:
        p.error(f"--epochs {args.epochs}: the cifar and resnet arms warm up for one epoch and then decay; give 2 or more")
    arms = args.arms.split(",") if args.arms else ARMS[args.suite]
    out_dir = result_folder(args.name or args.suite, "trainers")
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    runs_file = out_dir / "runs.jsonl"
    done = {(r["label"], r["seed"]) for r in load_runs(runs_file) if outcome(r) in COUNTED}
    command = "python -m benchmarks.comparisons.vs_trainers " + " ".join(sys.argv[1:])
    for seed in range(args.seeds):
        for arm in arms:
            if (arm, seed) in done:
                continue
            log = out_dir / "logs" / f"{arm.replace('+', '-')}-seed{seed}.jsonl"
            if log.exists():
                log.unlink()
            t0 = time.perf_counter()
            child = [sys.executable, "-m", __spec__.name, args.suite, "--child", arm, str(seed), str(log), "--steps", str(args.steps),
                     "--fast-steps", str(args.fast_steps), "--epochs", str(args.epochs), "--every", str(args.every)]
            if args.data:
                child += ["--data", args.data]
            if args.recipe:
                child += ["--recipe", args.recipe]
            if args.methods_recipe:
                child += ["--methods-recipe", args.methods_recipe]
            env = glibc_env() if arm in AS_DOCUMENTED else {**glibc_env(), **hasten_malloc()}
            provenance = run_provenance(out_dir.name, len(load_runs(runs_file)))
            with open(log.with_suffix(".log"), "w") as f:
                rc = subprocess.run(child, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
            evals, final, progress = read_worker_output(log)
            status = "finished" if rc == 0 and final else "failed"
            record = {"label": arm, "recipe": None, "overrides": [], "seed": seed, "status": status,
                      "wall_s": time.perf_counter() - t0, "evals": evals, "final": final, "progress": progress,
                      "log": log.name, "provenance": provenance,
                      # what the harness meant to give the process; what it had is final.machine.host_allocator
                      "intended_allocator": ("glibc defaults (as documented)" if arm in AS_DOCUMENTED
                                             else "hasten's settings, through the MALLOC_*_ environment")}
            with open(runs_file, "a") as f:
                f.write(json.dumps(record) + "\n")
            print(f"{arm} seed {seed}: {status}" + (f", {final['metrics']} in {final['train_s']:.1f} s" if final else ""),
                  flush=True)
    runs = [r for r in load_runs(runs_file) if r["label"] in arms]
    metric = "val/loss" if args.suite == "gpt" else "val/acc"
    op = "<=" if args.suite == "gpt" else ">="
    title = {"gpt": "hasten, the HF Trainer and both together: gpt",
             "cifar": "hasten, Lightning and both together: cifar",
             "resnet": "a user's ResNet: plain Lightning with bf16 and channels-last against hasten's recipe of it"}[args.suite]
    write_report(runs, arms, Target.parse(f"{metric}{op}@first-worst"), out_dir, title, command)
    steps = {}
    for r in runs:
        f = r.get("final") or {}
        if f.get("batch"):
            steps.setdefault(r["label"], []).append(f["train_s"] / f["batch"])
    lines = ["", "Seconds of training per optimizer step (mean over seeds; evaluations excluded):", ""]
    lines += [f"- {arm}: {sum(v) / len(v):.3f} s" for arm, v in steps.items()]
    settings = [r["final"].get("training_arguments") for r in runs if r.get("final") and r["final"].get("training_arguments")]
    if settings:
        lines += ["", "The HF arms' TrainingArguments (first seed): ", "", "```", json.dumps(settings[0], indent=1), "```"]
    with open(out_dir / "report.md", "a") as f:
        f.write("\n".join(lines) + "\n")
    print((out_dir / "report.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
