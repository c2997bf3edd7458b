"""The processes of a run: who this process is among them (rank, local rank, world size),
how they train together (none, ddp, fsdp), joining and leaving the process group, and the
one sum across ranks the loop needs at log and evaluation points.

Launched by `torchrun` (which sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT),
`join_world` joins the process group: gloo on the CPU, NCCL on CUDA, with a timeout that bounds
every collective, so a lost rank stops the others with an error instead of a hang.
"""
from __future__ import annotations

import datetime
import os
import socket
import sys
from dataclasses import dataclass

import torch

PARALLELISMS = ("auto", "none", "ddp", "fsdp")


@dataclass(frozen=True)
class World:
    """The processes of a run: this one's rank, its rank on its machine, how many there are,
    and how they train together ('none': one process; 'ddp': data-parallel, every rank holding
    the whole model; 'fsdp': data-parallel with parameters, gradients and optimizer state
    sharded across the ranks)."""
    rank: int = 0
    local_rank: int = 0
    size: int = 1
    parallelism: str = "none"
    owns_group: bool = False   # join_world joined the process group (leave() leaves it)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes logs, progress, metrics and checkpoints."""
        return self.rank == 0

    @property
    def data_parallel(self) -> bool:
        """Each rank trains on its share of every global batch (ddp and fsdp alike)."""
        return self.parallelism in ("ddp", "fsdp")

    @property
    def sharded(self) -> bool:
        """The model is sharded across the ranks (fsdp): saving and loading it are collectives."""
        return self.parallelism == "fsdp"

    def leave(self) -> None:
        """Leave the process group if join_world joined it, after every rank is done with its
        collectives (a rank that tears the group down while another still finishes its last
        one can make gloo abort that process)."""
        import torch.distributed as dist
        if self.owns_group and dist.is_available() and dist.is_initialized():
            try:
                dist.barrier()
            except RuntimeError:
                pass   # a lost rank: leave anyway
            dist.destroy_process_group()


def launched_world() -> tuple[int, int, int]:
    """(rank, local rank, world size) as torchrun set them; (0, 0, 1) otherwise."""
    try:
        return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
                int(os.environ.get("WORLD_SIZE", 1)))
    except ValueError as e:
        raise ValueError(f"RANK, LOCAL_RANK and WORLD_SIZE must be whole numbers (as torchrun sets them): {e}") from e


def join_world(parallelism: str, device: torch.device, timeout_s: float) -> World:
    """The run's World; under torchrun (or parallelism ddp/fsdp in one process) the process
    group joined, with the CUDA device of this rank bound."""
    if parallelism not in PARALLELISMS:
        raise ValueError(f"parallelism={parallelism!r}: use one of {PARALLELISMS}")
    rank, local_rank, size = launched_world()
    if parallelism == "auto":
        parallelism = "ddp" if size > 1 else "none"
    if parallelism == "none":
        if size > 1:
            raise ValueError(f"launched with {size} processes but parallelism=none: every process would train "
                             "alone on the same data; use parallelism=ddp (or auto), or launch one process")
        return World()
    import torch.distributed as dist
    if not dist.is_available():
        raise ValueError(f"parallelism={parallelism} needs torch.distributed, which this build of torch lacks")
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
    owns = False
    if not dist.is_initialized():
        if size > 1 and "MASTER_ADDR" not in os.environ:
            raise ValueError("WORLD_SIZE is set but MASTER_ADDR is not: launch with torchrun "
                             "(torchrun --nproc-per-node N -m hasten.cli train ...)")
        if size == 1:   # ddp or fsdp in one process (to measure its overhead): a local group of one
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        owns = True
    return World(rank=dist.get_rank(), local_rank=local_rank, size=dist.get_world_size(), parallelism=parallelism,
                 owns_group=owns)


def all_sum(device: torch.device, *values: float) -> "float | tuple":
    """The sums over all ranks of a few numbers (one all-reduce; at log and evaluation points only)."""
    import torch.distributed as dist
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    out = tuple(t.tolist())
    return out[0] if len(out) == 1 else out


def leave_worker(code: int) -> None:
    """End a process that torchrun started (WORLD_SIZE > 1) once its work is done and its
    process group is closed: flush its output and exit at once, skipping the interpreter's
    finalisation. There, gloo work objects still held by modules (FSDP keeps some) are torn
    down with the interpreter half gone, which can abort the process ('terminate called
    without an active exception') after a successful run, so torchrun would report a failure.
    Elsewhere (one process, tests calling `main`) it returns and nothing changes."""
    if launched_world()[2] <= 1:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
