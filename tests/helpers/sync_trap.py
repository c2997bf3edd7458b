"""Make host synchronisation inside training steps an error (for tests)."""
import torch

from hasten.core import Algorithm, Event

TRAPPED = ("item", "cpu", "__bool__", "__float__", "__int__", "tolist", "numpy")


def install(monkeypatch) -> Algorithm:
    """Patch Tensor methods that read device values so they raise between AFTER_DATALOADER and
    CHECKPOINT (the body of a training step); returns the Algorithm that arms the trap.
    `algo.steps` counts trapped steps."""
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
        events = (Event.AFTER_DATALOADER, Event.CHECKPOINT)
        steps = 0

        def apply(self, event, state, logger):
            if event == Event.AFTER_DATALOADER:
                trap["on"] = True
                self.steps += 1
            else:
                trap["on"] = False

    return Trap()
