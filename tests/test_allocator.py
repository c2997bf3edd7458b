"""The host allocator settings, checked against glibc's own accounting (mallinfo2) in fresh
processes, since the settings are process-wide and one-way."""
import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from hasten.allocator import configure_host_allocator


def _glibc_with_mallinfo2() -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    return hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallinfo2")


needs_glibc = pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc >= 2.33 (mallinfo2)")

# Allocates blocks of 1, 4, 16 and 512 MiB with malloc and reports how many of them glibc
# mapped with mmap (mallinfo2's hblks) and how much free memory it kept at the top of the heap
# after freeing them (keepcost). glibc maps a block when it is above the mmap threshold and the
# heap's free top cannot hold it: with the defaults (threshold 128 KiB at start) at least the
# 512 MiB block is mapped; with hasten's (32 MiB threshold, mmap max 0) none is, not even the
# 512 MiB block, which is above the largest threshold glibc accepts and larger than the
# 256 MiB top pad (so the heap's free top cannot hold it either). malloc does not touch the
# pages, so the large block costs address space only.
PROBE = textwrap.dedent("""
    import ctypes, ctypes.util, json, sys
    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    mode = sys.argv[1]
    if mode == "trainer":
        import torch
        from hasten import Trainer
        Trainer(torch.nn.Linear(2, 2), device="cpu")
    elif mode == "trainer-auto":
        import torch
        from hasten import Trainer
        Trainer(torch.nn.Linear(2, 2), device="cpu", host_allocator="auto")
    elif mode == "runtime-auto":
        from hasten import make_runtime
        make_runtime(device="cpu", host_allocator="auto")
    elif mode == "recipe":   # what hasten train and hasten bench do
        from hasten.build import recipe_runtime
        from hasten.config import load_recipe
        recipe_runtime(load_recipe("shakespeare-char-baseline", ["trainer.device=cpu"]))
    elif mode in ("lightning", "lightning-auto"):   # HastenCallback's set-up, in a real Lightning fit
        import torch, lightning as L
        from torch.utils.data import DataLoader, TensorDataset
        from hasten.integrations.lightning import HastenCallback
        class M(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(2, 2)
            def training_step(self, batch, i):
                return self.net(batch[0]).sum()
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)
        cb = HastenCallback([], host_allocator="auto" if mode == "lightning-auto" else "default")
        L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, callbacks=[cb]).fit(M(), DataLoader(TensorDataset(torch.ones(4, 2))))
    elif mode == "call":
        from hasten.allocator import tune_host_allocator
        print(tune_host_allocator().reason, file=sys.stderr)
    before = libc.mallinfo2().hblks
    blocks = [libc.malloc(n << 20) for n in (1, 4, 16, 512)]
    mapped = libc.mallinfo2().hblks - before
    for b in reversed(blocks):
        libc.free(b)
    print(json.dumps({"mapped": mapped, "keepcost_mib": libc.mallinfo2().keepcost / 2**20}))
""")


def _probe(mode: str, env_extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_glibc
def test_tuning_keeps_large_blocks_in_the_heap():
    plain, tuned = _probe("none"), _probe("call")
    assert plain["mapped"] >= 1          # glibc's default: large blocks go to mmap
    assert tuned["mapped"] == 0          # tuned: all four blocks come from the heap
    assert tuned["keepcost_mib"] >= 512  # and freeing them does not trim the heap


@needs_glibc
def test_library_users_opt_in_and_the_command_line_tunes_by_default():
    """A Trainer leaves its host process's malloc alone unless asked; hasten train and
    hasten bench (a recipe's runtime, host_allocator: auto) tune it on the CPU."""
    assert _probe("trainer")["mapped"] >= 1
    assert _probe("trainer-auto")["mapped"] == 0
    assert _probe("runtime-auto")["mapped"] == 0
    assert _probe("recipe")["mapped"] == 0


@needs_glibc
def test_the_lightning_callback_tunes_only_when_asked():
    """HastenCallback(host_allocator="auto") tunes the allocator at set-up, as hasten train
    does; without it Lightning's process keeps glibc's defaults (HastenTrainer shares the
    same set-up, hasten.integrations.host.HostLoop)."""
    pytest.importorskip("lightning")
    assert _probe("lightning")["mapped"] >= 1
    assert _probe("lightning-auto")["mapped"] == 0


@needs_glibc
def test_user_environment_wins():
    # The user's own settings (here: mmap blocks above 1 MiB that the heap's free top cannot
    # hold) are left in place: large blocks are mapped, where hasten's settings map none.
    probed = _probe("trainer-auto", {"MALLOC_MMAP_THRESHOLD_": str(2**20 - 1)})
    assert probed["mapped"] >= 1


def test_bad_mode_is_named():
    with pytest.raises(ValueError, match="host_allocator='fast'.*auto"):
        configure_host_allocator("fast", "cpu")
    assert configure_host_allocator("default", "cpu") is None
    assert configure_host_allocator("auto", "cuda") is None


def test_the_recorded_allocator_state_is_what_the_process_had():
    """A process hasten did not tune reports what its environment set (a harness giving an arm
    MALLOC_*_ variables), not glibc's defaults: records observe, they do not repeat intentions."""
    code = "from hasten.allocator import host_allocator_state; print(host_allocator_state())"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    plain = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, timeout=60)
    given = subprocess.run([sys.executable, "-c", code], env={**clean, "MALLOC_TOP_PAD_": str(256 * 2**20)},
                           capture_output=True, text=True, timeout=60)
    assert "set in the environment" not in plain.stdout
    assert given.stdout.strip() == f"host allocator: set in the environment, not by hasten (MALLOC_TOP_PAD_={256 * 2**20})"
