"""The CIFAR-10 image-folder zip in a form small enough to travel to a lent GPU machine.

The zip holds 60,000 small JPEGs, each compressed on its own, so every file repeats the same
quantisation and Huffman tables; one solid tar.xz of the same files is about 30% of the zip's
size. `pack` writes it in the zip's member order; `unpack` rebuilds a zip with the same members
in the same order and the same bytes, so hasten's reader decodes the same arrays.

    python -m benchmarks.tools.gpu_data pack .data/cifar10-jpeg.zip .gpudata/cifar.tar.xz     # at home
    python -m benchmarks.tools.gpu_data unpack .gpudata/cifar.tar.xz .data/cifar10-jpeg.zip   # on the GPU machine
"""
from __future__ import annotations

import io
import lzma
import sys
import tarfile
import zipfile
from pathlib import Path


def pack(zip_path: str, tar_path: str) -> None:
    Path(tar_path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tar_path).with_suffix(".xz.partial")
    with zipfile.ZipFile(zip_path) as z, tarfile.open(tmp, "w:xz", preset=9 | lzma.PRESET_EXTREME) as t:
        for info in z.infolist():
            if info.is_dir():
                continue
            data = z.read(info)
            member = tarfile.TarInfo(info.filename)
            member.size = len(data)
            t.addfile(member, io.BytesIO(data))
    tmp.replace(tar_path)


def unpack(tar_path: str, zip_path: str) -> None:
    Path(zip_path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(zip_path).with_suffix(".zip.partial")
    with tarfile.open(tar_path) as t, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for member in t:
            if member.isfile():
                z.writestr(member.name, t.extractfile(member).read())
    tmp.replace(zip_path)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] not in ("pack", "unpack"):
        print("usage: gpu_data.py pack ZIP TAR_XZ | unpack TAR_XZ ZIP", file=sys.stderr)
        return 2
    try:
        (pack if argv[0] == "pack" else unpack)(argv[1], argv[2])
    except (OSError, tarfile.TarError, zipfile.BadZipFile) as e:
        print(f"gpu_data.py {argv[0]}: {argv[1]}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
