"""Image classification (CIFAR-10, or any ImageNet-style image folder) with the reference conv nets.

Two loaders: `dataloader` (a host DataLoader with worker processes and per-sample
augmentation: what most users write) and `device` (hasten.data.DeviceLoader: the dataset
on the training device as uint8, whole-batch augmentation there, no workers).

`stream` names a prepared image source (`hasten data prepare`: a local folder or an object-store
URL): its raw uint8 images are read shard by shard by DataLoader workers, in a shard-local order
that resumes exactly (hasten.data.streaming), with the host loader's augmentation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import torch

from ..data.cifar import MEAN, STD, load_cifar10
from ..data.device import DeviceLoader
from ..data.imagefolder import ImageFolder, RandomResizedCrop, ResizeCenterCrop
from ..data.loaders import TensorPairs, make_dataloader
from ..data.transforms import Normalize, RandomCropFlip
from ..data.streaming import StreamImages, StreamOptions, open_source, splits
from ..errors import ConfigError, DataError
from ..models import MODELS
from ..models.flops import training_flops_per_sample
from ..schema import setting, signature_config, suggest
from ..registry import register_task
from ..usercode import is_target
from .base import Built, NamedModel, Quality, TaskSpec, build_named, hf_model_section, user_loaders


@dataclass
class DataConfig(StreamOptions):
    dataset: Literal["cifar10", "imagefolder"] = "cifar10"
    """cifar10 (downloaded and checksummed, or data.path) or an ImageNet-style image folder."""
    factory: Optional[str] = None
    """Your own data instead: `module:function` returning (train, eval) datasets or loaders (hasten.tasks.base.user_loaders)."""
    factory_args: dict[str, Any] = field(default_factory=dict)
    """factory: its keyword arguments."""
    num_classes: Optional[int] = setting(None, ge=2)
    """factory: the number of classes (default: the training dataset's `classes`)."""
    path: Optional[str] = None
    """cifar10: the official archive or folder, or an image-folder zip; imagefolder: the root."""
    stream: Optional[str] = None
    """A prepared image source to stream instead (a folder or s3://... URL from hasten data prepare); the dataset's transforms apply (cifar10: crop and flip; imagefolder: resized crops)."""
    image_size: int = setting(224, ge=1)
    """imagefolder: the training crop and evaluation size."""
    eval_resize: int = setting(256, ge=1)
    """imagefolder: the shorter side before the central crop."""
    train_split: str = "train"
    """imagefolder: the training sub-folder."""
    eval_split: str = "val"
    """imagefolder: the evaluation sub-folder."""
    loader: Literal["dataloader", "device"] = "dataloader"
    """dataloader: host workers, per-sample augmentation; device: the data set on the device, whole-batch augmentation."""
    batch_size: int = setting(512, ge=1)
    """Training batch size."""
    eval_batch_size: int = setting(1000, ge=1)
    """Evaluation batch size."""
    num_workers: Optional[int] = setting(None, ge=0)
    """dataloader only: worker processes; default: cores - 1."""
    pad: int = setting(4, ge=0)
    """Random crop / translate by up to `pad` pixels (0: none)."""
    pad_mode: Literal["constant", "reflect"] = "constant"
    """Padding for the random crop; the device loader always reflects."""
    flip: bool = True
    """Random horizontal flips."""
    alternate_flip: bool = False
    """device loader: flip each image in alternate epochs."""
    cutout: int = setting(0, ge=0)
    """device loader: side of the zeroed square (0: none)."""
    brightness: float = setting(0.0, ge=0)
    """device loader: each image shifted by up to this many standard deviations, drawn anew each epoch (0: none)."""
    contrast: float = setting(0.0, ge=0, lt=1)
    """device loader: each normalised image scaled by 1 +- up to this, drawn anew each epoch (0: none)."""
    channels_last: bool = False
    """device loader: batches in channels-last memory format."""
    drop_last: bool = False
    """Drop the last, incomplete training batch of each epoch."""


def model_config(raw: dict) -> NamedModel:
    hf_section = hf_model_section(raw)
    if hf_section is not None:   # a transformers image classifier (hf/vit) or a user's module
        return hf_section
    raw = dict(raw or {})
    name = raw.pop("name", None)
    if name not in MODELS:
        raise ConfigError(f"model.name: {name!r} is not a known model; choose one of {sorted(MODELS)}."
                          + (suggest(str(name), MODELS) if name else ""))
    ctor = MODELS[name]
    return NamedModel(name, signature_config(ctor.__init__ if isinstance(ctor, type) else ctor, raw, "model"))


def _model(m: NamedModel, classes: int = 10, image_size: int = 32) -> torch.nn.Module:
    if m.name.startswith("hf/") or is_target(m.name):
        return build_named("image_classification", m, {"num_labels": classes, "image_size": image_size},
                           {"num_classes": classes, "image_size": image_size})
    try:
        return MODELS[m.name](**m.args)
    except ValueError as e:   # a packaged model refuses a value of the recipe's model section
        raise ConfigError(f"model ({m.name}): {e}") from None


def _accuracy(classes: int):
    """Top-1 accuracy; torchmetrics is imported here, not at start-up (it takes seconds to import)."""
    from torchmetrics.classification import MulticlassAccuracy
    return MulticlassAccuracy(classes, average="micro")


def _refuse_device_only(d: DataConfig, imagefolder: bool = False) -> None:
    """One line naming the data.* keys a host DataLoader would ignore: only hasten's device loader has them."""
    device_only = [k for k in ("alternate_flip", "cutout", "brightness", "contrast", "channels_last") if getattr(d, k)]
    if not device_only:
        return
    keys = ", ".join("data." + k for k in device_only)
    one = len(device_only) == 1
    it = "it" if one else "them"
    if imagefolder:
        raise ConfigError(f"{keys}: only hasten's device loader has {it}, and "
                          f"data.dataset=imagefolder decodes images in DataLoader workers: remove {keys}")
    raise ConfigError(f"{keys} need{'s' if one else ''} data.loader=device (only hasten's device loader has {it})")


def _device_loaders(d: DataConfig, data, seed: int, device):
    flip = ("alternate" if d.alternate_flip else "random") if d.flip else "none"
    common = dict(mean=MEAN, std=STD, device=device, channels_last=d.channels_last, seed=seed)
    train = DeviceLoader(data.train_x, data.train_y, d.batch_size, translate=d.pad, flip=flip, cutout=d.cutout,
                         brightness=d.brightness, contrast=d.contrast, shuffle=True, drop_last=d.drop_last, **common)
    test = DeviceLoader(data.test_x, data.test_y, d.eval_batch_size, shuffle=False, **common)
    return train, test


def _build_imagefolder(recipe, runtime) -> Built:
    d: DataConfig = recipe.data
    if d.loader != "dataloader":
        raise ConfigError("data.dataset=imagefolder decodes images in DataLoader workers: use data.loader=dataloader")
    _refuse_device_only(d, imagefolder=True)   # the workers' transforms have none of these
    if not d.path:
        raise ConfigError("data.dataset=imagefolder needs data.path=<root with train/ and val/ class folders>")
    train_set = ImageFolder(d.path, d.train_split)
    eval_set = ImageFolder(d.path, d.eval_split, classes=train_set.classes)
    model = _model(recipe.model, len(train_set.classes), d.image_size)
    seed = runtime.seed
    train = make_dataloader(train_set, d.batch_size, shuffle=True, seed=seed, transform=RandomResizedCrop(d.image_size, flip=d.flip),
                            num_workers=d.num_workers, drop_last=d.drop_last)
    test = make_dataloader(eval_set, d.eval_batch_size, shuffle=False, seed=seed,
                           transform=ResizeCenterCrop(d.eval_resize, d.image_size), num_workers=d.num_workers)
    flops = training_flops_per_sample(model, torch.zeros(1, 3, d.image_size, d.image_size))
    n = len(train_set.classes)
    return Built(model=model, train_dataloader=train, eval_dataloader=test,
                 metrics={"acc": _accuracy(n)},
                 flops_per_sample=flops,
                 info={"train_images": len(train_set), "eval_images": len(eval_set), "classes": n,
                       "params": sum(p.numel() for p in model.parameters())})


def _build_factory(recipe, runtime) -> Built:
    d: DataConfig = recipe.data
    if d.loader != "dataloader":
        raise ConfigError("data.loader=device needs hasten's own dataset (the whole set on the device); with "
                          "data.factory your loaders are used as given: remove data.loader, or return tensors from "
                          "a dataset hasten reads (docs/your-model.md)")
    device_only = [k for k in ("alternate_flip", "cutout", "brightness", "contrast", "channels_last") if getattr(d, k)]
    if device_only:
        keys = ", ".join("data." + k for k in device_only)
        raise ConfigError(f"{keys}: hasten's device loader's, which data.factory does not use; remove "
                          f"{'it' if len(device_only) == 1 else 'them'}" + (" (channels-last batches and model: "
                          "algorithms.channels_last={})" if "channels_last" in device_only else ""))
    train, test, given = user_loaders(d.factory, d.factory_args, d.batch_size, d.eval_batch_size, runtime.seed,
                                      d.num_workers, d.drop_last)
    source = getattr(given, "dataset", given)   # a DataLoader's dataset, or the dataset itself
    classes = d.num_classes or len(getattr(source, "classes", None) or []) or None
    if classes is None:
        raise ConfigError(f"data.factory: give data.num_classes (the number of classes {d.factory}'s data has)")
    model = _model(recipe.model, classes, d.image_size)
    return Built(model=model, train_dataloader=train, eval_dataloader=test,
                 metrics={"acc": _accuracy(classes)},
                 info={"data": d.factory, "classes": classes, "params": sum(p.numel() for p in model.parameters())})


def _build_stream(recipe, runtime) -> Built:
    """A prepared image source, streamed (hasten.data.streaming)."""
    d: DataConfig = recipe.data
    if d.loader != "dataloader":
        raise ConfigError("data.stream reads images in DataLoader workers: use data.loader=dataloader (the device "
                          "loader holds a whole data set on the device)")
    if d.path:
        raise ConfigError("give data.stream or data.path, not both")
    _refuse_device_only(d, imagefolder=d.dataset == "imagefolder")
    manifest = open_source(d.stream, "images", "data.stream", d)
    train_split, eval_split = splits(d.stream, manifest, d, ("train", "eval"))
    classes = len(manifest.get("classes") or []) or None
    if classes is None:
        raise DataError(f"{d.stream}: the prepared source lists no classes; prepare it again")
    seed = runtime.seed
    if d.dataset == "imagefolder":
        train_set, eval_set = StreamImages(train_split, pil=True), StreamImages(eval_split, pil=True)
        train_tf, eval_tf, size = RandomResizedCrop(d.image_size, flip=d.flip), ResizeCenterCrop(d.eval_resize,
                                                                                                   d.image_size), d.image_size
    else:
        train_set, eval_set = StreamImages(train_split), StreamImages(eval_split)
        train_tf = RandomCropFlip(MEAN, STD, pad=d.pad, flip=d.flip, mode=d.pad_mode)
        eval_tf, size = Normalize(MEAN, STD), (manifest.get("image_shape") or [32])[0]
    model = _model(recipe.model, classes, size)
    train = make_dataloader(train_set, d.batch_size, shuffle=True, seed=seed, transform=train_tf,
                            num_workers=d.num_workers, drop_last=d.drop_last, blocks=train_split.blocks)
    test = make_dataloader(eval_set, d.eval_batch_size, shuffle=False, seed=seed, transform=eval_tf,
                           num_workers=d.num_workers)
    flops = training_flops_per_sample(model, torch.zeros(1, 3, size, size))
    return Built(model=model, train_dataloader=train, eval_dataloader=test, metrics={"acc": _accuracy(classes)},
                 flops_per_sample=flops,
                 info={"train_images": len(train_set), "eval_images": len(eval_set), "source": d.stream,
                       "params": sum(p.numel() for p in model.parameters())})


def build(recipe, runtime) -> Built:
    d: DataConfig = recipe.data
    if d.factory:
        return _build_factory(recipe, runtime)
    if d.stream:
        return _build_stream(recipe, runtime)
    if d.dataset == "imagefolder":
        return _build_imagefolder(recipe, runtime)
    data = load_cifar10(d.path)
    model = _model(recipe.model, len(data.classes), data.train_x.shape[1])
    seed = runtime.seed
    if d.loader == "device":
        train, test = _device_loaders(d, data, seed, runtime.device)
    else:
        _refuse_device_only(d)
        train = make_dataloader(TensorPairs(data.train_x, data.train_y), d.batch_size, shuffle=True, seed=seed,
                                transform=RandomCropFlip(MEAN, STD, pad=d.pad, flip=d.flip, mode=d.pad_mode),
                                num_workers=d.num_workers, drop_last=d.drop_last)
        test = make_dataloader(TensorPairs(data.test_x, data.test_y), d.eval_batch_size, shuffle=False, seed=seed,
                               transform=Normalize(MEAN, STD), num_workers=d.num_workers)
    flops = training_flops_per_sample(model, torch.zeros(1, 3, *data.train_x.shape[1:3]))
    return Built(model=model, train_dataloader=train, eval_dataloader=test,
                 metrics={"acc": _accuracy(len(data.classes))},
                 flops_per_sample=flops,
                 info={"train_images": len(data.train_x), "test_images": len(data.test_x),
                       "params": sum(p.numel() for p in model.parameters())})


SPEC = register_task(TaskSpec(
    name="image_classification", aliases=("classification",),
    description="classification: CIFAR-10, an image folder or your own data (data.factory), with any model",
    data_config=DataConfig, model_config=NamedModel, parse_model=model_config, build=build,
    quality=Quality("val/acc", "max"), logs=("val/loss", "val/acc")))
