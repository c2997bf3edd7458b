"""Make host synchronisation inside training steps an error (for tests)."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hasten.core import Algorithm, Callback

TRAPPED = ("item", "cpu", "__bool__", "__float__", "__int__", "tolist", "numpy")


def install(monkeypatch, quiet: bool = False):
    """Patch Tensor methods that read device values so they raise between AFTER_DATALOADER and
    CHECKPOINT (the body of a training step); returns the Algorithm that arms the trap.
    `algo.steps` counts trapped steps.

    quiet=True returns a Callback instead, which listens to no event inside a step: it arms the trap at each batch's CHECKPOINT of a run that
    goes on and disarms it at the next BATCH_END (before any logging) and at EPOCH_END and
    FIT_END; the first batch of each epoch is not trapped."""
    trap = {"on": False}

    def guard(name, orig):
        def f(self, *a, **k):
            if trap["on"]:
                raise AssertionError(f"host sync: Tensor.{name} inside a training step")
            return orig(self, *a, **k)
        return f

    for name in TRAPPED:
        monkeypatch.setattr(torch.Tensor, name, guard(name, getattr(torch.Tensor, name)))
    return _armer(trap, quiet)


# aten operators that copy a value to the host (on a GPU: wait for the device) or whose output
# size depends on values; any Tensor method, Python conversion or C++ caller reaches them
SCALAR_READS = {"_local_scalar_dense", "nonzero", "is_nonzero", "masked_select", "_unique2", "unique_dim",
                "unique_consecutive", "repeat_interleave", "equal"}


class ScalarReadTrap(TorchDispatchMode):
    """Raises when an operator in SCALAR_READS runs while `trap["on"]`; enter it around a fit."""

    def __init__(self, trap: dict):
        super().__init__()
        self.trap = trap

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.trap["on"] and func.overloadpacket.__name__ in SCALAR_READS:
            raise AssertionError(f"host sync: aten.{func.overloadpacket.__name__} inside a training step")
        return func(*args, **(kwargs or {}))


def dispatch_trap(quiet: bool = False):
    """As install(), caught at the dispatcher instead of on Tensor methods (so also reads from
    C++ and from code that converts with float()/bool() on a result): returns (mode, armer);
    run the fit inside `with mode:`. Eager code only (torch.compile traces through modes)."""
    trap = {"on": False}
    return ScalarReadTrap(trap), _armer(trap, quiet)


def _armer(trap: dict, quiet: bool):
    class Trap(Algorithm):
        steps = 0

        def after_dataloader(self, state, logger):
            trap["on"] = True
            self.steps += 1

        def checkpoint(self, state, logger):
            trap["on"] = False

    class QuietTrap(Callback):
        steps = 0

        def checkpoint(self, state, logger):
            # the first batch of an epoch starts the loader's epoch (host work): not trapped
            trap["on"] = not (state.at_epoch_end or state.is_done() or state.stop_training)

        def batch_end(self, state, logger):
            self.steps += trap["on"]
            trap["on"] = False

        def epoch_end(self, state, logger):
            trap["on"] = False

        def fit_end(self, state, logger):
            trap["on"] = False

    return QuietTrap() if quiet else Trap()
