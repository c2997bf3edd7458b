"""Make host synchronisation inside training steps an error (for tests)."""
import torch

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
