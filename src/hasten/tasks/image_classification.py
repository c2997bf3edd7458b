"""Image classification (CIFAR-10) with the reference conv nets."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torchmetrics

from ..config import ConfigError, _suggest, signature_config
from ..data.cifar import MEAN, STD, load_cifar10
from ..data.loaders import TensorPairs, make_dataloader
from ..data.transforms import Normalize, RandomCropFlip
from ..models.flops import training_flops_per_sample
from ..models.resnet import ResNet9
from .base import Built

MODELS = {"resnet9": ResNet9}


@dataclass
class DataConfig:
    dataset: Literal["cifar10"] = "cifar10"
    path: Optional[str] = None            # local copy: official archive/folder or image-folder zip
    batch_size: int = 512
    eval_batch_size: int = 1000
    num_workers: Optional[int] = None     # default: cores - 1
    pad: int = 4                          # random-crop padding (0: no crop)
    flip: bool = True
    drop_last: bool = False


def model_config(raw: dict) -> dict:
    raw = dict(raw or {})
    name = raw.pop("name", None)
    if name not in MODELS:
        raise ConfigError(f"model.name: {name!r} is not a known model; choose one of {sorted(MODELS)}."
                          + (_suggest(str(name), MODELS) if name else ""))
    return {"name": name, **signature_config(MODELS[name].__init__, raw, "model")}


def build(recipe) -> Built:
    d: DataConfig = recipe.data
    data = load_cifar10(d.path)
    params = dict(recipe.model)
    model = MODELS[params.pop("name")](**params)
    seed = recipe.trainer.seed
    train = make_dataloader(TensorPairs(data.train_x, data.train_y), d.batch_size, shuffle=True, seed=seed,
                            transform=RandomCropFlip(MEAN, STD, pad=d.pad, flip=d.flip),
                            num_workers=d.num_workers, drop_last=d.drop_last)
    test = make_dataloader(TensorPairs(data.test_x, data.test_y), d.eval_batch_size, shuffle=False, seed=seed,
                           transform=Normalize(MEAN, STD), num_workers=d.num_workers)
    flops = training_flops_per_sample(model, torch.zeros(1, 3, *data.train_x.shape[1:3]))
    return Built(model=model, train_dataloader=train, eval_dataloader=test,
                 metrics={"acc": torchmetrics.classification.MulticlassAccuracy(len(data.classes), average="micro")},
                 flops_per_sample=flops,
                 info={"train_images": len(data.train_x), "test_images": len(data.test_x),
                       "params": sum(p.numel() for p in model.parameters())})
