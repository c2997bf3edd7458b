"""The airbench94 CIFAR-10 procedure, ported to the CPU: a peer to run beside `cifar10-fast`.

airbench94 (Keller Jordan, 2024: 94.01% in 3.83 s on an A100 on the original CIFAR-10) is a
hand-tuned single-file speedrun. This file is hasten's own plain-PyTorch rendering of its
published procedure, not a copy of its code, with the changes a CPU needs: bf16 autocast
instead of fp16 weights, fp32 parameters, CPU timers. On a CPU without bf16 hardware (no
AVX512-BF16 or AMX) it trains in plain fp32 instead (`--precision`, default auto), as hasten's
`precision: auto` does: emulated bf16 is many times slower there. It uses nothing from hasten
but the dataset reader (decoding is not timed; the bf16 check is its own, not hasten's), so it
measures what a careful user gets from plain PyTorch. The procedure:

- network: 2x2 patch-whitening conv (24 filters: eigenvectors of the uncentred patch
  covariance of 5,000 training images over sqrt(eigenvalue + 5e-4), and their negatives;
  frozen; bias trained for the first 3 epochs), GELU, three groups of conv3x3 -> max-pool 2 ->
  BN -> GELU -> conv3x3 -> BN -> GELU at widths 64/256/256 (convs without bias, the first
  in_channels filters Dirac-initialised; BN with frozen unit scale, eps 1e-12, momentum 0.4),
  max-pool 3, linear head without bias, logits times 1/9;
- data: normalised, flipped once at random, reflect-padded by 2; every epoch a random
  translation of the whole set, all images flipped in odd epochs, a random order; batch 1024,
  last partial batch dropped;
- optimiser: SGD with Nesterov momentum 0.85 on the summed label-smoothed (0.2) loss,
  lr 11.5 and weight decay 0.0153 per 1024 examples in decoupled form (lr / 7850.7,
  decay 0.0153 * 1024 / 7850.7 per step), BN biases at 64x the lr with the same decay per
  step; triangular lr schedule 0.2 -> 1 (at 23%) -> 0.07 over 9.9 epochs;
- lookahead: from epoch 3, every 5 steps the weights and BN statistics are pulled into a
  slow copy and copied back, with decay 0.95^5 * progress^3; the slow copy is loaded at
  every epoch end;
- evaluation: test-time augmentation over 6 views (the image and its mirror, at no shift
  and shifted one pixel up-left and down-right with reflect padding; weights 1/2 for the
  unshifted pair, 1/4 for each shifted pair).

Timed like airbench: the whitening fit, every training epoch (augmentation included) and the
final augmented evaluation; per-epoch evaluations are not timed (and run only with
`--epoch-evals`). Before the timed runs, a warm-up trains a throwaway network for a few
steps on random labels so that one-off kernel set-up is not timed (airbench's compiled
variant does the same with a whole warm-up run).

    python -m benchmarks.comparisons.peers.airbench94_cpu --data cifar10-jpeg.zip --seeds 1
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN = torch.tensor([125.307, 122.961, 113.8575]) / 255
STD = torch.tensor([62.9932, 62.0887, 66.7048]) / 255

HYP = dict(epochs=9.9, batch_size=1024, lr=11.5, momentum=0.85, weight_decay=0.0153, bias_scaler=64.0,
           label_smoothing=0.2, lookahead_start_epoch=3, lookahead_decay=0.95, lookahead_pow=3.0,
           lookahead_every=5, whiten_bias_epochs=3, translate=2, widths=(64, 256, 256), bn_momentum=0.4,
           logit_scale=1 / 9, whiten_images=5000, whiten_eps=5e-4, eval_batch=2000)


# ----------------------------------------------------------------------------------- network
class FrozenScaleBN(nn.BatchNorm2d):
    def __init__(self, channels: int):
        super().__init__(channels, eps=1e-12, momentum=HYP["bn_momentum"])
        self.weight.requires_grad_(False)


def conv3x3(c_in: int, c_out: int) -> nn.Conv2d:
    conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
    with torch.no_grad():
        nn.init.dirac_(conv.weight[:c_in])      # identity for the first c_in filters
    return conv


def group(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(conv3x3(c_in, c_out), nn.MaxPool2d(2), FrozenScaleBN(c_out), nn.GELU(),
                         conv3x3(c_out, c_out), FrozenScaleBN(c_out), nn.GELU())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        w1, w2, w3 = HYP["widths"]
        self.whiten = nn.Conv2d(3, 24, 2, bias=True)
        nn.init.zeros_(self.whiten.bias)
        self.whiten.weight.requires_grad_(False)
        self.body = nn.Sequential(nn.GELU(), group(24, w1), group(w1, w2), group(w2, w3), nn.MaxPool2d(3))
        self.head = nn.Linear(w3, 10, bias=False)

    def forward(self, x):
        return self.head(self.body(self.whiten(x)).flatten(1)) * HYP["logit_scale"]


@torch.no_grad()
def fit_whitening(conv: nn.Conv2d, images: torch.Tensor, eps: float) -> None:
    patches = images.float().unfold(2, 2, 1).unfold(3, 2, 1)            # N, C, 31, 31, 2, 2
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, 12)           # every 2x2 patch, (c, h, w) order
    cov = patches.T @ patches / len(patches)                              # uncentred, as airbench
    evals, evecs = torch.linalg.eigh(cov)
    filters = (evecs.T / torch.sqrt(evals + eps)[:, None]).reshape(12, 3, 2, 2)
    conv.weight.copy_(torch.cat([filters, -filters]))


# -------------------------------------------------------------------------------------- data
class EpochData:
    """The whole training set on the CPU, augmented one epoch at a time as airbench does."""

    def __init__(self, images_u8: torch.Tensor, labels: torch.Tensor, gen: torch.Generator):
        x = images_u8.permute(0, 3, 1, 2).float().div_(255)
        x = ((x - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1)).to(torch.bfloat16 if AMP["on"] else torch.float32)
        self.labels, self.gen, self.epoch = labels, gen, 0
        flip = torch.rand(len(x), generator=gen) < 0.5                   # one random flip per image, once
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        p = HYP["translate"]
        self.padded = F.pad(x, (p, p, p, p), mode="reflect").contiguous(memory_format=torch.channels_last)

    def epoch_batches(self, batch_size: int):
        p, n = HYP["translate"], len(self.labels)
        shifts = torch.randint(-p, p + 1, (n, 2), generator=self.gen)
        out = torch.empty(n, 3, 32, 32, dtype=self.padded.dtype).contiguous(memory_format=torch.channels_last)
        for dy in range(-p, p + 1):
            for dx in range(-p, p + 1):
                sel = ((shifts[:, 0] == dy) & (shifts[:, 1] == dx)).nonzero().squeeze(1)
                out[sel] = self.padded[sel, :, p + dy:p + dy + 32, p + dx:p + dx + 32]
        if self.epoch % 2 == 1:                                            # every other epoch, all flipped
            out = out.flip(-1)
        self.epoch += 1
        order = torch.randperm(n, generator=self.gen)
        for i in range(n // batch_size):                                  # the last partial batch is dropped
            idx = order[i * batch_size:(i + 1) * batch_size]
            yield out[idx], self.labels[idx]


def normalised(images_u8: torch.Tensor) -> torch.Tensor:
    x = images_u8.permute(0, 3, 1, 2).float().div_(255)
    return ((x - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1)).contiguous(memory_format=torch.channels_last)


# -------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, tta: bool) -> float:
    model.eval()

    def mirror(x):
        return 0.5 * model(x) + 0.5 * model(x.flip(-1))

    correct = 0
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AMP["on"]):
        for x, y in zip(images.split(HYP["eval_batch"]), labels.split(HYP["eval_batch"])):
            if tta:
                padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
                shifted = 0.5 * (mirror(padded[:, :, 0:32, 0:32]) + mirror(padded[:, :, 2:34, 2:34]))
                logits = 0.5 * mirror(x) + 0.5 * shifted
            else:
                logits = model(x)
            correct += (logits.argmax(1) == y).sum().item()
    model.train()
    return correct / len(labels)


# ---------------------------------------------------------------------------------- training
def triangle(step: int, total: int, start=0.2, peak_at=0.23, end=0.07) -> float:
    peak = int(peak_at * total)
    if step < peak:
        return start + (1 - start) * step / peak
    return 1 + (end - 1) * (step - peak) / (total - peak)


def run(data, seed: int, epoch_evals: bool, warmup_steps: int = 0) -> dict:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    bs, mom = HYP["batch_size"], HYP["momentum"]
    kilostep = 1024 * (1 + 1 / (1 - mom))
    lr = HYP["lr"] / kilostep
    wd = HYP["weight_decay"] * bs / kilostep
    lr_bias = lr * HYP["bias_scaler"]
    labels = data.train_y if not warmup_steps else torch.randint(0, 10, data.train_y.shape, generator=gen)
    train = EpochData(data.train_x, labels, gen)
    test_x, test_y = normalised(data.test_x), data.test_y

    model = Net().to(memory_format=torch.channels_last)
    norm_biases = [p for n, p in model.named_parameters() if isinstance(model.get_submodule(n.rsplit(".", 1)[0]), nn.BatchNorm2d) and p.requires_grad]
    others = [p for p in model.parameters() if p.requires_grad and all(p is not q for q in norm_biases)]
    opt = torch.optim.SGD([dict(params=norm_biases, lr=lr_bias, weight_decay=wd / lr_bias),
                           dict(params=others, lr=lr, weight_decay=wd / lr)], momentum=mom, nesterov=True)
    for g in opt.param_groups:
        g["base_lr"] = g["lr"]
    loss_fn = nn.CrossEntropyLoss(label_smoothing=HYP["label_smoothing"], reduction="none")
    steps_per_epoch = len(labels) // bs
    total = math.ceil(steps_per_epoch * HYP["epochs"]) if not warmup_steps else warmup_steps
    timed = {"whitening": 0.0, "training": 0.0, "tta_eval": 0.0}
    evals = []

    t0 = time.perf_counter()
    fit_whitening(model.whiten, normalised(data.train_x[:HYP["whiten_images"]]), HYP["whiten_eps"])
    timed["whitening"] = time.perf_counter() - t0

    step, slow = 0, None
    every, base = HYP["lookahead_every"], HYP["lookahead_decay"] ** HYP["lookahead_every"]
    for epoch in range(math.ceil(total / steps_per_epoch)):
        t0 = time.perf_counter()
        model.whiten.bias.requires_grad_(epoch < HYP["whiten_bias_epochs"])
        for x, y in train.epoch_batches(bs):
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * triangle(step, total)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AMP["on"]):
                loss = loss_fn(model(x), y).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if epoch >= HYP["lookahead_start_epoch"] and step % every == 0:
                with torch.no_grad():
                    if slow is None:
                        slow = {k: v.clone() for k, v in model.state_dict().items()}
                    else:
                        decay = base * (step / total) ** HYP["lookahead_pow"]
                        for k, v in model.state_dict().items():
                            if v.is_floating_point():
                                slow[k].lerp_(v, 1 - decay)
                                v.copy_(slow[k])
            if step >= total:
                break
        if slow is not None:
            with torch.no_grad():
                for k, v in model.state_dict().items():
                    if v.is_floating_point():
                        v.copy_(slow[k])
        timed["training"] += time.perf_counter() - t0
        if epoch_evals and not warmup_steps:
            evals.append({"epoch": epoch + 1, "acc": evaluate(model, test_x, test_y, tta=False)})
            print(f"  epoch {epoch + 1}: val acc {evals[-1]['acc']:.4f}, training {timed['training']:.1f} s", flush=True)
        if step >= total:
            break
    if warmup_steps:
        evaluate(model, test_x[:2 * HYP["eval_batch"]], test_y[:2 * HYP["eval_batch"]], tta=True)
        return {}
    t0 = time.perf_counter()
    acc = evaluate(model, test_x, test_y, tta=True)
    timed["tta_eval"] = time.perf_counter() - t0
    return {"seed": seed, "acc_tta": acc, "acc": evaluate(model, test_x, test_y, tta=False),
            "timed_s": sum(timed.values()), "parts_s": timed, "steps": step, "epoch_evals": evals}


AMP = {"on": True}   # bf16 autocast; off (fp32) with --precision fp32


def cpu_has_bf16() -> bool:
    """Whether the CPU computes in bf16 natively (AVX512-BF16 or AMX); without it bf16 is
    emulated and convolutions run several times slower than in fp32."""
    try:
        flags = next(ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="CIFAR-10: the official archive or folder, or an image-folder zip (hasten's reader)")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--epoch-evals", action="store_true", help="evaluate after every epoch (not timed)")
    ap.add_argument("--out", help="append one JSON line per run to this file")
    ap.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                    help="bf16 autocast or plain fp32; auto: bf16 where the CPU has AVX512-BF16 or AMX")
    args = ap.parse_args(argv)
    AMP["on"] = args.precision == "bf16" or (args.precision == "auto" and cpu_has_bf16())

    from hasten.data.cifar import load_cifar10      # the reader only; nothing else of hasten
    data = load_cifar10(args.data)
    allocator = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    info = {"peer": "airbench94 (CPU port)", "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "malloc_env": allocator,
            "precision": "bf16" if AMP["on"] else "fp32"}
    run(data, seed=10_000, epoch_evals=False, warmup_steps=3)          # warm-up, not timed
    results = []
    for seed in range(args.seed0, args.seed0 + args.seeds):
        r = {**run(data, seed, args.epoch_evals), **info}
        results.append(r)
        print(f"seed {seed}: acc {r['acc_tta']:.4f} (no TTA {r['acc']:.4f}), timed {r['timed_s']:.1f} s "
              f"(whitening {r['parts_s']['whitening']:.2f}, training {r['parts_s']['training']:.1f}, "
              f"TTA eval {r['parts_s']['tta_eval']:.1f})", flush=True)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")
    if len(results) > 1:
        accs = torch.tensor([r["acc_tta"] for r in results])
        times = torch.tensor([r["timed_s"] for r in results])
        print(f"mean acc {accs.mean():.4f} +- {accs.std():.4f}, mean timed {times.mean():.1f} +- {times.std():.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
