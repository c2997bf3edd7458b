"""LRMonitor: logs the learning rate of every parameter group at log points."""
from __future__ import annotations

from ..core import Callback
from ..optim.compiled import lr_value


class LRMonitor(Callback):
    def batch_end(self, state, logger):
        if not state.log_due:
            return
        for i, opt in enumerate(state.optimizers):
            for j, g in enumerate(opt.param_groups):
                name = g.get("name", f"group{j}")
                logger.log({f"lr/opt{i}/{name}": lr_value(g)})
