"""The runtime: device, precision, seed, threads and the host allocator, resolved once.

Everything that depends on where and how a run computes reads one `Runtime`: the task (the
device loader's device), the optimizers (Muon's Newton-Schulz precision follows the run's),
the algorithms (through `state.runtime`) and the Trainer. `hasten train` and `hasten bench`
create it first, before the model is built; a Python user does the same with one call::

    rt = hasten.make_runtime(device="auto", precision="auto", seed=0)   # seeds, threads, allocator
    model = MyNet()                                                     # initialised under rt.seed
    Trainer(model, loader, runtime=rt, ...)

or passes a model factory (`Trainer(lambda: MyNet(), ..., seed=0)`), which the Trainer calls
after resolving its runtime. What seeds what:

- `make_runtime` seeds Python's, NumPy's and torch's generators with `seed`, so a model built
  after it is initialised the same way every time;
- the Trainer seeds them again with the same seed when it is constructed, so the training
  stream (dropout, a loader without its own seed) does not depend on how much randomness
  building the model took;
- hasten's loaders and data methods derive their own generators from (seed, epoch, batch or
  sample), so data order and augmentation do not depend on either.

The world: launched by `torchrun` (which sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT), `make_runtime` joins the process group (gloo on the CPU, NCCL on CUDA, the
device bound from LOCAL_RANK, a timeout you can set) and records rank and world size in
`Runtime.world`; `Runtime.close()` leaves it. `parallelism`: 'none', 'ddp', or 'auto' (ddp
when launched with more than one process). See docs/distributed.md.
"""
from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass, field

import torch

from .allocator import MODES as ALLOCATOR_MODES
from .allocator import AllocatorReport, configure_host_allocator
from .utils import resolve_device, resolve_precision, seed_everything

PARALLELISMS = ("auto", "none", "ddp", "fsdp")
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "auto")   # auto: the fastest the hardware runs natively
_AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}
_NO_AUTOCAST = contextlib.nullcontext()   # reusable: fp32 steps enter no real context


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
    owns_group: bool = False   # make_runtime joined the process group (close() leaves it)

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


def launched_world() -> tuple[int, int, int]:
    """(rank, local rank, world size) as torchrun set them; (0, 0, 1) otherwise."""
    try:
        return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
                int(os.environ.get("WORLD_SIZE", 1)))
    except ValueError as e:
        raise ValueError(f"RANK, LOCAL_RANK and WORLD_SIZE must be whole numbers (as torchrun sets them): {e}") from e


@dataclass(frozen=True)
class Runtime:
    """Where and how a run computes, resolved: no 'auto' is left in it."""
    device: torch.device
    precision: str                      # fp32 | bf16-mixed | fp16-mixed
    seed: int
    threads: int                        # torch's intra-op threads, as set
    host_allocator: str                 # the mode asked for: auto | tuned | default
    allocator_report: AllocatorReport | None = None   # what tuning did (None: not asked)
    asked_precision: str = "fp32"       # before resolution ('auto' stays visible in reports)
    world: World = field(default_factory=World)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return _AUTOCAST_DTYPES.get(self.precision)

    @property
    def matmul_dtype(self) -> torch.dtype:
        """The dtype the run's matrix products use: bf16 under bf16-mixed, fp32 otherwise
        (Muon's Newton-Schulz iteration follows it unless its ns_dtype is set)."""
        return torch.bfloat16 if self.precision == "bf16-mixed" else torch.float32

    @property
    def device_synchronize(self):
        """The function that waits for the device's queued work (None on the CPU, where
        nothing is queued): the Trainer calls it where a timed segment ends."""
        if self.device.type == "cuda":
            return torch.cuda.synchronize
        if self.device.type == "mps":
            return torch.mps.synchronize
        return None

    def autocast(self):
        """The autocast context of a forward pass (a shared no-op context in fp32)."""
        dtype = self.autocast_dtype
        return _NO_AUTOCAST if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    def describe(self) -> str:
        chosen = ", chosen by precision=auto" if self.asked_precision == "auto" else ""
        world = (f", rank {self.world.rank} of {self.world.size} ({self.world.parallelism})"
                 if self.world.size > 1 else "")
        return (f"device {self.device}, precision {self.precision}{chosen}, seed {self.seed}, "
                f"{self.threads} threads, host allocator {self.host_allocator}{world}")

    def close(self) -> None:
        """Leave the process group if make_runtime joined it, after every rank is done with its
        collectives (a rank that tears the group down while another still finishes its last
        one can make gloo abort that process)."""
        import torch.distributed as dist
        if self.world.owns_group and dist.is_available() and dist.is_initialized():
            try:
                dist.barrier()
            except RuntimeError:
                pass   # a lost rank: leave anyway
            dist.destroy_process_group()


def make_runtime(device: "str | torch.device" = "auto", precision: str = "fp32", seed: int = 0,
                 threads: int | None = None, host_allocator: str = "default", parallelism: str = "auto",
                 timeout_s: float = 600.0) -> Runtime:
    """Resolve the runtime and apply its process-wide settings, in this order: the world
    (under torchrun: join the process group, bind the device), the thread count
    (`torch.set_num_threads`, when given), the host allocator, the seeds.

    parallelism: 'auto' (ddp when launched with more than one process, none otherwise),
    'none', 'ddp', or 'fsdp' (sharded; also in one process, a mesh of one, to measure it);
    timeout_s bounds every collective, so a lost rank stops the others with an error instead
    of a hang.

    host_allocator: 'default' (the default for library users) leaves glibc malloc alone;
    'auto' tunes it when training on the CPU (`hasten train` and `hasten bench` ask for
    this: it is their measured gain), 'tuned' whatever the device. See hasten.allocator.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {PRECISIONS}")
    if host_allocator not in ALLOCATOR_MODES:
        raise ValueError(f"host_allocator={host_allocator!r}: use one of {ALLOCATOR_MODES}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a whole number >= 0, got {seed!r}")
    if parallelism not in PARALLELISMS:
        raise ValueError(f"parallelism={parallelism!r}: use one of {PARALLELISMS}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    if threads is not None:
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a whole number >= 1, got {threads!r}")
        torch.set_num_threads(threads)
    dev = resolve_device(device)
    world = _join_world(parallelism, dev, timeout_s)
    if world.size > 1 and dev.type == "cuda":
        dev = torch.device("cuda", world.local_rank)
    report = configure_host_allocator(host_allocator, dev.type)
    seed_everything(seed)   # the same seed on every rank: the same initial model, the same global batches
    return Runtime(device=dev, precision=resolve_precision(precision, dev), seed=seed,
                   threads=torch.get_num_threads(), host_allocator=host_allocator, allocator_report=report,
                   asked_precision=precision, world=world)


def _join_world(parallelism: str, device: torch.device, timeout_s: float) -> World:
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
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        owns = True
    return World(rank=dist.get_rank(), local_rank=local_rank, size=dist.get_world_size(), parallelism=parallelism,
                 owns_group=owns)


def leave_worker(code: int) -> None:
    """End a process that torchrun started (WORLD_SIZE > 1) once its work is done and its
    process group is closed: flush its output and exit at once, skipping the interpreter's
    finalisation. There, gloo work objects still held by modules (FSDP keeps some) are torn
    down with the interpreter half gone, which can abort the process ('terminate called
    without an active exception') after a successful run, so torchrun would report a failure.
    Elsewhere (one process, tests calling `main`) it returns and nothing changes."""
    import sys
    if launched_world()[2] <= 1:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
