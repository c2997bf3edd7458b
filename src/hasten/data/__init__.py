"""Data: loaders with good defaults, resumable order, datasets (text, CIFAR-10)."""
from .device import DeviceLoader
from .download import ChecksumError, DatasetNotFoundError, data_root, download
from .loaders import TensorPairs, default_workers, make_dataloader
from .resumable import ResumableSampler, TransformDataset, epoch_iterator
from .text import ByteTokenizer, CharTokenizer, EvalWindows, RandomWindows, load_text, split_tokens

__all__ = ["ByteTokenizer", "DeviceLoader", "CharTokenizer", "ChecksumError", "DatasetNotFoundError", "EvalWindows",
           "RandomWindows", "ResumableSampler", "TensorPairs", "TransformDataset", "data_root",
           "default_workers", "download", "epoch_iterator", "load_text", "make_dataloader", "split_tokens"]
