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
from dataclasses import dataclass, field

import torch

from .allocator import MODES as ALLOCATOR_MODES
from .allocator import AllocatorReport, configure_host_allocator
from .distributed.world import PARALLELISMS, World, join_world, launched_world, leave_worker  # noqa: F401 (re-exported)
from .hardware import cpu_has_bf16
from .seeding import seed_everything

PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "auto")   # auto: the fastest the hardware runs natively
_AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


def names_float8(precision) -> bool:
    """Whether a precision someone asked for means float8 ('fp8-mixed', 'float8', ...): that is
    the float8_training algorithm on top of bf16-mixed, not a precision; the errors say so."""
    return isinstance(precision, str) and ("fp8" in precision.lower() or "float8" in precision.lower())


_NO_AUTOCAST = contextlib.nullcontext()   # reusable: fp32 steps enter no real context


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
        """Leave the process group if make_runtime joined it (hasten.distributed.World.leave)."""
        self.world.leave()

    @classmethod
    def of(cls, device: "str | torch.device" = "cpu", precision: str = "fp32", seed: int = 0) -> "Runtime":
        """A runtime that only describes (nothing is applied: no seeding, threads or allocator
        settings): for a State built by hand, e.g. in a test of an algorithm."""
        dev = resolve_device(device)
        return cls(device=dev, precision=resolve_precision(precision, dev), seed=seed,
                   threads=torch.get_num_threads(), host_allocator="default", asked_precision=precision)


def make_runtime(device: "str | torch.device" = "auto", precision: str = "fp32", seed: int = 0,
                 threads: int | None = None, host_allocator: str = "default", parallelism: str = "auto",
                 timeout_s: float = 600.0) -> Runtime:
    """Resolve the runtime and apply its process-wide settings, in this order: the world
    (under torchrun: join the process group, bind the device), the thread count
    (`torch.set_num_threads`, when given), the host allocator, a GPU's one-off library set-up
    (`prepare_device`), the seeds.

    parallelism: 'auto' (ddp when launched with more than one process, none otherwise),
    'none', 'ddp', or 'fsdp' (sharded; also in one process, a mesh of one, to measure it);
    timeout_s bounds every collective, so a lost rank stops the others with an error instead
    of a hang.

    host_allocator: 'default' (the default for library users) leaves glibc malloc alone;
    'auto' tunes it when training on the CPU (`hasten train` and `hasten bench` ask for
    this: it is their measured gain), 'tuned' whatever the device. See hasten.allocator.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {PRECISIONS}"
                         + ("; float8 training is an algorithm on top of bf16-mixed: precision='bf16-mixed', "
                            "algorithms=[Float8Training()]" if names_float8(precision) else ""))
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
    world = join_world(parallelism, dev, timeout_s)
    if world.size > 1 and dev.type == "cuda":
        dev = torch.device("cuda", world.local_rank)
    report = configure_host_allocator(host_allocator, dev.type)
    prepare_device(dev)
    seed_everything(seed)   # the same seed on every rank: the same initial model, the same global batches
    return Runtime(device=dev, precision=resolve_precision(precision, dev), seed=seed,
                   threads=torch.get_num_threads(), host_allocator=host_allocator, allocator_report=report,
                   asked_precision=precision, world=world)


def prepare_device(dev: torch.device) -> None:
    """Pay a GPU's one-off library set-up now, before any run's clock: the CUDA context and the
    cuBLAS handle with its workspace (a tiny product in fp32 and in fp64), which the first
    matrix product of a process otherwise pays, whichever part of the run does it (on an H200,
    patch whitening's fit at INIT: measured in benchmarks/probes/whiten_fit_probe.py). A compared
    script's untimed warm-up run pays the same. Nothing to do on the CPU or MPS."""
    if dev.type != "cuda":
        return
    with torch.cuda.device(dev):
        for dtype in (torch.float32, torch.float64):
            a = torch.ones(8, 8, device=dev, dtype=dtype)
            a @ a
        torch.cuda.synchronize(dev)


def resolve_device(device: "str | torch.device") -> torch.device:
    """'auto' becomes CUDA, then MPS, then the CPU, whichever is there first."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"unknown device {device!r}: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'") from e
    return check_device(dev)


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def check_device(dev: torch.device) -> torch.device:
    """`dev` if this machine has it, else a ValueError saying what is here."""
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this build of torch has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ValueError(f"device {dev} is not available here ({why}); use auto or cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {dev} is not available here (this machine has {torch.cuda.device_count()} "
                             f"CUDA device(s): cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    elif dev.type == "mps" and not _mps_available():
        raise ValueError(f"device {dev} is not available here (no Apple GPU); use auto or cpu")
    return dev


def resolve_precision(precision: str, device: torch.device, flags: frozenset | None = None) -> str:
    """'auto' becomes the fastest precision the device runs natively: bf16-mixed on CUDA GPUs
    with bf16 (fp16-mixed on older ones) and on CPUs with AVX512-BF16 or AMX, fp32 elsewhere.
    Without bf16 hardware a CPU emulates bf16 and runs convolutions several times slower
    than in fp32. Other values pass through."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "fp16-mixed"
    if device.type == "cpu" and cpu_has_bf16(flags):
        return "bf16-mixed"
    return "fp32"
