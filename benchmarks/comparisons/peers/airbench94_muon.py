"""The airbench94_muon CIFAR-10 procedure: the peer `cifar10-fast` is measured against.

airbench94_muon (Keller Jordan, 2024; KellerJordan/cifar10-airbench, airbench94_muon.py:
94.01% in 2.59 s on an A100, 0.68x airbench94's time there) replaces airbench94's SGD and
Lookahead with Muon on the convolution kernels. This file is hasten's own plain-PyTorch
rendering of its published procedure (its steps and numbers, not its code), followed step by
step; it imports nothing from hasten but the dataset reader and the record's provenance.

- data: normalised, flipped once at random, reflect-padded by 2; every epoch a random
  translation of the whole set, all images flipped in odd epochs, a random order; batch 2000,
  8 epochs, the last partial batch dropped;
- network: a 2x2 whitening conv of 24 filters (the eigenvectors of the patch covariance of
  5,000 training images over sqrt(eigenvalue + 5e-4), and their negatives; frozen) whose bias
  starts at torch's default conv init and is trained for the first 3 epochs, then taken out of
  the graph (detached: later backward passes stop before it), GELU, three groups of conv3x3 ->
  max-pool 2 -> BN -> GELU -> conv3x3 -> BN -> GELU at widths 64/256/256 (convs without bias,
  Dirac-initialised on their first in_channels filters; BN with frozen unit scale, eps 1e-12,
  momentum 0.4), max-pool 3, a linear head without bias whose weights are scaled to std 1,
  logits / 256;
- loss: the summed cross-entropy with label smoothing 0.2;
- optimisers: Muon on every conv kernel (lr 0.24, Nesterov momentum 0.6, three quintic
  Newton-Schulz steps with coefficients (3.4445, -4.7750, 2.0315); each kernel rescaled to
  norm sqrt(out channels) before its update; no weight decay); SGD with Nesterov momentum 0.85
  on the whitening bias and the BN biases (lr 0.053) and on the head (lr 0.67), weight decay
  2e-6 x batch size / each group's lr; every lr linear to 0 over the run (the whitening bias's
  over its 3 epochs);
- evaluation: test-time augmentation over 6 views (the image and its mirror, unshifted and
  shifted one pixel up-left and down-right; weights 1/2 for the unshifted pair, 1/4 for each
  shifted pair).
- timed, as upstream: the whitening fit, every training epoch with its data augmentation, and
  the final augmented evaluation; per-epoch evaluations are not timed.

Deviations from upstream, each a CPU adaptation:
- device and precision: upstream keeps fp16 weights (BN in fp32) on a GPU; the CPU has no fast
  fp16, so here bf16 autocast with fp32 weights where the CPU has bf16 hardware (AVX512-BF16 or
  AMX), fp32 elsewhere (`--precision`), and the Newton-Schulz iteration in that precision (bf16
  upstream);
- compilation: upstream compiles the net (max-autotune) and Newton-Schulz; torch.compile does
  not pay for this net on a 2-core CPU (measured in docs/tune.md), so the CPU runs eager;
- timers and warm-up: host timers instead of CUDA events; instead of a whole warm-up run
  (upstream's compilation run), a few steps on random labels, untimed;
- the random streams are torch's CPU generator, seeded per run (upstream draws on the GPU).

On a GPU (`--device cuda`) the run is as published: fp16 weights with BN in fp32, no autocast,
the net compiled with mode max-autotune and Newton-Schulz compiled, cudnn.benchmark, fused
SGD, a whole warm-up run untimed, CUDA events around each timed part.

    python -m benchmarks.comparisons.peers.airbench94_muon --data cifar10-jpeg.zip --seeds 1
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN = torch.tensor([125.307, 122.961, 113.8575]) / 255
STD = torch.tensor([62.9932, 62.0887, 66.7048]) / 255

HYP = dict(epochs=8, batch_size=2000, muon_lr=0.24, muon_momentum=0.6, ns_steps=3, sgd_momentum=0.85,
           bias_lr=0.053, head_lr=0.67, weight_decay=2e-6, label_smoothing=0.2, whiten_bias_epochs=3, translate=2,
           widths=(64, 256, 256), bn_momentum=0.4, logit_divisor=256.0, whiten_images=5000, whiten_eps=5e-4,
           eval_batch=2000)
NS_COEFFS = (3.4445, -4.7750, 2.0315)
# amp: bf16 autocast over fp32 weights (a CPU with bf16 hardware); half: fp16 weights and inputs, BN in fp32
# (a GPU, as published); compile: the net under torch.compile(mode=max-autotune) and Newton-Schulz compiled
RUN = {"amp": True, "half": False, "device": torch.device("cpu"), "compile": False}


def input_dtype() -> torch.dtype:
    return torch.float16 if RUN["half"] else torch.bfloat16 if RUN["amp"] else torch.float32


# ----------------------------------------------------------------------------------- network
class FrozenScaleBN(nn.BatchNorm2d):
    def __init__(self, channels: int):
        super().__init__(channels, eps=1e-12, momentum=HYP["bn_momentum"])
        self.weight.requires_grad_(False)


def conv3x3(c_in: int, c_out: int) -> nn.Conv2d:
    conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
    with torch.no_grad():
        nn.init.dirac_(conv.weight[:c_in])
    return conv


def group(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(conv3x3(c_in, c_out), nn.MaxPool2d(2), FrozenScaleBN(c_out), nn.GELU(),
                         conv3x3(c_out, c_out), FrozenScaleBN(c_out), nn.GELU())


class Net(nn.Module):
    def __init__(self, make_group=None, widths=None):   # the Hive's net passes its own groups and widths
        super().__init__()
        w1, w2, w3 = widths or HYP["widths"]
        make_group = make_group or group
        self.whiten = nn.Conv2d(3, 24, 2, bias=True)   # its bias keeps torch's default init, as upstream
        self.whiten.weight.requires_grad_(False)
        self.body = nn.Sequential(nn.GELU(), make_group(24, w1), make_group(w1, w2), make_group(w2, w3),
                                  nn.MaxPool2d(3))
        self.head = nn.Linear(w3, 10, bias=False)
        self.logit_divisor = HYP["logit_divisor"]
        with torch.no_grad():
            self.head.weight.div_(self.head.weight.std())

    def forward(self, x, train_whiten_bias: bool = True):
        """`train_whiten_bias` false: the whitening bias enters as a constant (out of the graph)."""
        b = self.whiten.bias if train_whiten_bias else self.whiten.bias.detach()
        x = F.conv2d(x, self.whiten.weight, b)
        return self.head(self.body(x).flatten(1)) / self.logit_divisor


@torch.no_grad()
def fit_whitening(conv: nn.Conv2d, images: torch.Tensor, eps: float) -> None:
    patches = images.float().unfold(2, 2, 1).unfold(3, 2, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, 12)
    cov = patches.T @ patches / len(patches)
    evals, evecs = torch.linalg.eigh(cov)
    filters = (evecs.T / torch.sqrt(evals + eps)[:, None]).reshape(12, 3, 2, 2)
    conv.weight.copy_(torch.cat([filters, -filters]).to(conv.weight))


# ------------------------------------------------------------------------------------ Muon
def newton_schulz(g: torch.Tensor, steps: int, dtype: torch.dtype, coeffs=NS_COEFFS, eps: float = 1e-7) -> torch.Tensor:
    """The quintic iteration toward the nearest semi-orthogonal matrix (rows <= cols by transposing)."""
    a, b, c = coeffs
    x = g.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + eps)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return (x.T if tall else x).to(g.dtype)


NS = {"fn": newton_schulz}   # compiled with --compile, as upstream compiles it


class KernelMuon(torch.optim.Optimizer):
    """Muon on conv kernels: Nesterov momentum, then each kernel's update orthogonalised on its
    (out, in * kh * kw) view; the kernel is rescaled to norm sqrt(out channels) before the update;
    decoupled weight decay `weight_decay` (times the group's current lr).

    The Hive's variant (peers/hive_cifar10.py) sets the rest: `norm_every` (rescale once that
    many steps have passed, an int or a function of the step count; 1 here), `decay_last` (the decay after the update instead of before), the
    iteration's `coeffs` and `ns_eps`, and `norm_eps` added to the kernel's norm."""

    def __init__(self, params, lr: float, momentum: float, weight_decay: float, ns_steps: int, ns_dtype: torch.dtype,
                 norm_every=1, decay_last: bool = False, coeffs=NS_COEFFS, ns_eps: float = 1e-7,
                 norm_eps: float = 0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))
        self.ns_steps, self.ns_dtype, self.norm_every, self.decay_last = ns_steps, ns_dtype, norm_every, decay_last
        self.coeffs, self.ns_eps, self.norm_eps, self.steps, self.last_rescale = coeffs, ns_eps, norm_eps, 0, 0

    @torch.no_grad()
    def step(self):
        self.steps += 1
        # the kernels are rescaled once `norm_every` steps have passed since the last time (an int, or
        # a function of the step count: the Hive's interval that grows over the run)
        every = self.norm_every(self.steps) if callable(self.norm_every) else self.norm_every
        rescale = self.steps - self.last_rescale >= every
        if rescale:
            self.last_rescale = self.steps
        for group in self.param_groups:
            lr, mom, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum", torch.zeros_like(p.grad))
                buf.mul_(mom).add_(p.grad)
                g = p.grad.add(buf, alpha=mom)
                update = NS["fn"](g.reshape(len(g), -1), self.ns_steps, self.ns_dtype, self.coeffs,
                                  self.ns_eps).view_as(p)
                if rescale:
                    p.mul_(len(p) ** 0.5 / (p.norm() + self.norm_eps))
                if not self.decay_last:
                    p.mul_(1 - lr * wd)
                p.add_(update, alpha=-lr)
                if self.decay_last:
                    p.mul_(1 - lr * wd)


# -------------------------------------------------------------------------------------- data
class EpochData:
    def __init__(self, images_u8: torch.Tensor, labels: torch.Tensor, gen: torch.Generator):
        x = images_u8.permute(0, 3, 1, 2).float().div_(255)
        x = ((x - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1))
        self.labels, self.gen, self.epoch = labels.to(RUN["device"]), gen, 0
        flip = torch.rand(len(x), generator=gen) < 0.5
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        p = HYP["translate"]
        self.padded = F.pad(x, (p, p, p, p), mode="reflect").to(RUN["device"], input_dtype()).contiguous(
            memory_format=torch.channels_last)

    def epoch_batches(self, batch_size: int):
        p, n = HYP["translate"], len(self.labels)
        shifts = torch.randint(-p, p + 1, (n, 2), generator=self.gen).to(RUN["device"])
        out = torch.empty(n, 3, 32, 32, dtype=self.padded.dtype, device=RUN["device"]).contiguous(
            memory_format=torch.channels_last)
        for dy in range(-p, p + 1):
            for dx in range(-p, p + 1):
                sel = ((shifts[:, 0] == dy) & (shifts[:, 1] == dx)).nonzero().squeeze(1)
                out[sel] = self.padded[sel, :, p + dy:p + dy + 32, p + dx:p + dx + 32]
        if self.epoch % 2 == 1:
            out = out.flip(-1)
        self.epoch += 1
        order = torch.randperm(n, generator=self.gen).to(RUN["device"])
        for i in range(n // batch_size):
            idx = order[i * batch_size:(i + 1) * batch_size]
            yield out[idx], self.labels[idx]


def normalised(images_u8: torch.Tensor) -> torch.Tensor:
    x = images_u8.permute(0, 3, 1, 2).float().div_(255)
    x = (x - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1)
    return x.to(RUN["device"], torch.float16 if RUN["half"] else torch.float32).contiguous(
        memory_format=torch.channels_last)


# -------------------------------------------------------------------------------- evaluation
def _autocast():
    return torch.autocast(RUN["device"].type, dtype=torch.bfloat16, enabled=RUN["amp"])


@torch.no_grad()
def evaluate(model, images: torch.Tensor, labels: torch.Tensor, tta: bool) -> float:
    model.eval()

    def mirror(x):
        return 0.5 * model(x) + 0.5 * model(x.flip(-1))

    correct = 0
    with _autocast():
        for x, y in zip(images.split(HYP["eval_batch"]), labels.split(HYP["eval_batch"])):
            if tta:
                padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
                shifted = 0.5 * (mirror(padded[:, :, 0:32, 0:32]) + mirror(padded[:, :, 2:34, 2:34]))
                logits = 0.5 * mirror(x) + 0.5 * shifted
            else:
                logits = model(x)
            correct += (logits.argmax(1) == y.to(logits.device)).sum().item()
    model.train()
    return correct / len(labels)


# ---------------------------------------------------------------------------------- training
class Timer:
    """Seconds of a part: perf_counter on the CPU; CUDA events on a GPU (the work done)."""

    def __init__(self):
        self.total = 0.0

    def __enter__(self):
        if RUN["device"].type == "cuda":
            self.a, self.b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if RUN["device"].type == "cuda":
            self.b.record()
            torch.cuda.synchronize()
            self.total += self.a.elapsed_time(self.b) / 1000
        else:
            self.total += time.perf_counter() - self.t


def make_muon(kernels: list, weight_decay: float, ns_dtype: torch.dtype, total_steps: int) -> torch.optim.Optimizer:
    """Muon for the conv kernels, without weight decay (upstream's Muon has none; `weight_decay`,
    the SGD groups' decay, is for procedures that decay their kernels too)."""
    return KernelMuon(kernels, lr=HYP["muon_lr"], momentum=HYP["muon_momentum"], weight_decay=0.0,
                      ns_steps=HYP["ns_steps"], ns_dtype=ns_dtype)


def run(data, seed: int, epoch_evals: bool, warmup_steps: int = 0, proc=None) -> dict:
    """One seed's timed run of the procedure `proc` (a module with HYP, Net, EpochData,
    make_muon and evaluate; this one by default: peers/hive_cifar10.py passes itself)."""
    proc = proc or sys.modules[__name__]
    HYP, Net, EpochData, evaluate = proc.HYP, proc.Net, proc.EpochData, proc.evaluate
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    bs = HYP["batch_size"]
    labels = data.train_y if not warmup_steps else torch.randint(0, 10, data.train_y.shape, generator=gen)
    train = EpochData(data.train_x, labels, gen)
    test_x, test_y = normalised(data.test_x), data.test_y

    model = Net().to(RUN["device"], memory_format=torch.channels_last)
    if RUN["half"]:   # as published on a GPU: fp16 weights, batch norm in fp32
        model.half()
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.float()
    kernels = [p for p in model.parameters() if p.dim() == 4 and p.requires_grad]
    norm_biases = [p for n, p in model.named_parameters()
                   if isinstance(model.get_submodule(n.rsplit(".", 1)[0]), nn.BatchNorm2d) and p.requires_grad]
    wd = HYP["weight_decay"] * bs
    sgd = torch.optim.SGD([dict(params=[model.whiten.bias], lr=HYP["bias_lr"], weight_decay=wd / HYP["bias_lr"]),
                           dict(params=norm_biases, lr=HYP["bias_lr"], weight_decay=wd / HYP["bias_lr"]),
                           dict(params=[model.head.weight], lr=HYP["head_lr"], weight_decay=wd / HYP["head_lr"])],
                          momentum=HYP["sgd_momentum"], nesterov=True, fused=RUN["device"].type == "cuda")
    steps_per_epoch = len(labels) // bs
    total = math.ceil(HYP["epochs"] * steps_per_epoch) if not warmup_steps else warmup_steps
    bias_steps = math.ceil(HYP["whiten_bias_epochs"] * steps_per_epoch)
    # Newton-Schulz precision: upstream's on a GPU (the procedure's NS_DTYPE), else the run's matmul precision
    ns_dtype = getattr(proc, "NS_DTYPE", torch.bfloat16) if RUN["half"] else (
        torch.bfloat16 if RUN["amp"] else torch.float32)
    muon = proc.make_muon(kernels, wd, ns_dtype, total)
    for opt in (sgd, muon):
        for g in opt.param_groups:
            g["base_lr"] = g["lr"]
    forward = torch.compile(model, mode="max-autotune") if RUN["compile"] else model
    loss_fn = nn.CrossEntropyLoss(label_smoothing=HYP["label_smoothing"], reduction="sum")
    whitening, training, tta_eval = Timer(), Timer(), Timer()
    evals = []
    with whitening:
        getattr(proc, "fit_whitening", fit_whitening)(model.whiten, normalised(data.train_x[:HYP["whiten_images"]]),
                                                      HYP["whiten_eps"])
    step = 0
    for epoch in range(math.ceil(total / steps_per_epoch)):
        with training:
            for x, y in train.epoch_batches(bs):
                frac = 1 - step / total
                sgd.param_groups[0]["lr"] = sgd.param_groups[0]["base_lr"] * max(0.0, 1 - step / bias_steps)
                for g in sgd.param_groups[1:] + muon.param_groups:
                    g["lr"] = g["base_lr"] * frac
                with _autocast():
                    loss = loss_fn(forward(x, step < bias_steps), y)   # the bias leaves the graph after its steps
                sgd.zero_grad(set_to_none=True)
                muon.zero_grad(set_to_none=True)
                loss.backward()
                sgd.step()
                muon.step()
                step += 1
                if step >= total:
                    break
        if epoch_evals and not warmup_steps:
            evals.append({"epoch": epoch + 1, "acc": evaluate(forward, test_x, test_y, tta=False)})
            print(f"  epoch {epoch + 1}: val acc {evals[-1]['acc']:.4f}, training {training.total:.1f} s", flush=True)
        if step >= total:
            break
    if warmup_steps:
        evaluate(forward, test_x[:2 * HYP["eval_batch"]], test_y[:2 * HYP["eval_batch"]], tta=True)
        return {}
    with tta_eval:
        acc = evaluate(forward, test_x, test_y, tta=True)
    parts = {"whitening": whitening.total, "training": training.total, "tta_eval": tta_eval.total}
    return {"seed": seed, "acc_tta": acc, "acc": evaluate(forward, test_x, test_y, tta=False),
            "timed_s": sum(parts.values()), "parts_s": parts, "steps": step, "epoch_evals": evals}


def cpu_has_bf16() -> bool:
    try:
        flags = next(ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


def main(argv=None, proc=None, name: str = "airbench94_muon (hasten's rendering)") -> int:
    """The command line of a peer script: this one's, or `proc`'s (peers/hive_cifar10.py)."""
    proc = proc or sys.modules[__name__]
    ap = argparse.ArgumentParser(description=proc.__doc__.split("\n")[0])
    ap.add_argument("--data", help="CIFAR-10: the official archive or folder, or an image-folder zip (hasten's reader)")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--epoch-evals", action="store_true", help="evaluate after every epoch (not timed)")
    ap.add_argument("--out", help="append one JSON line per run to this file")
    ap.add_argument("--precision", choices=("auto", "bf16", "fp32", "fp16"), default="auto",
                    help="bf16: autocast over fp32 weights; fp16: fp16 weights with BN in fp32 (upstream's, on a "
                         "GPU); auto: fp16 on a GPU, bf16 on a CPU with AVX512-BF16 or AMX, fp32 elsewhere")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--compile", action="store_true", help="torch.compile the network (mode max-autotune) and "
                    "Newton-Schulz, as published (on a GPU)")
    ap.add_argument("--comparison", help="the results folder these runs are made for (recorded as provenance)")
    ap.add_argument("--order", type=int, help="this run's place in the comparison's run order (recorded)")
    args = ap.parse_args(argv)
    RUN["device"] = torch.device(args.device)
    RUN["compile"] = args.compile
    cuda = RUN["device"].type == "cuda"
    precision = args.precision if args.precision != "auto" else "fp16" if cuda else "bf16" if cpu_has_bf16() else "fp32"
    RUN["amp"], RUN["half"] = precision == "bf16", precision == "fp16"
    if cuda:
        torch.backends.cudnn.benchmark = True   # as published
    if args.compile:
        NS["fn"] = torch.compile(newton_schulz)

    from hasten.data.cifar import load_cifar10      # the reader only
    from hasten.provenance import run_provenance    # the record's commit, machine and start time
    data = load_cifar10(args.data)
    info = {"peer": name, "device": str(RUN["device"]), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "compiled": RUN["compile"], "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
            "precision": precision}
    steps = math.ceil(proc.HYP["epochs"] * (len(data.train_y) // proc.HYP["batch_size"]))
    run(data, seed=10_000, epoch_evals=False, warmup_steps=steps if RUN["device"].type == "cuda" else 3, proc=proc)
    results = []
    for i, seed in enumerate(range(args.seed0, args.seed0 + args.seeds)):
        provenance = run_provenance(args.comparison, None if args.order is None else args.order + i)
        r = {**run(data, seed, args.epoch_evals, proc=proc), **info, "provenance": provenance}
        results.append(r)
        print(f"seed {seed}: acc {r['acc_tta']:.4f} (no TTA {r['acc']:.4f}), timed {r['timed_s']:.2f} s "
              f"(whitening {r['parts_s']['whitening']:.2f}, training {r['parts_s']['training']:.2f}, "
              f"TTA eval {r['parts_s']['tta_eval']:.2f})", flush=True)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")
    if len(results) > 1:
        accs = torch.tensor([r["acc_tta"] for r in results])
        times = torch.tensor([r["timed_s"] for r in results])
        print(f"mean acc {accs.mean():.4f} +- {accs.std():.4f}, mean timed {times.mean():.2f} +- {times.std():.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
