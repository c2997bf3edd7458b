"""Training events, listed in the order the Trainer fires them.

One fit, one epoch, one batch::

    INIT                         once, in Trainer.__init__: model surgery happens here,
                                 optimizers are built from their factory right after
    FIT_START
    EPOCH_START
      BEFORE_DATALOADER          before the next batch is fetched
      AFTER_DATALOADER           the batch is in state.batch (on the device)
      BATCH_START
        BEFORE_FORWARD           } once per micro-batch (grad_accum > 1 splits the batch)
        AFTER_FORWARD            }   state.outputs holds the model outputs
        BEFORE_LOSS              }
        AFTER_LOSS               }   state.loss holds per-sample (or per-token) losses:
                                 }   algorithms may reweight or drop them here
        BEFORE_BACKWARD          }   state.loss is now the reduced scalar
        AFTER_BACKWARD           }
      BEFORE_OPTIM_STEP          gradients of the whole step are ready (clipping happens here)
      AFTER_OPTIM_STEP
      BATCH_END                  timestamp already counts this batch
      EVAL_START .. EVAL_END     when eval_interval says so (EVAL_BATCH_START/END per batch)
      CHECKPOINT                 the checkpoint point of the batch, after any evaluation:
                                 the Checkpoint callback saves here when its interval is due
    EPOCH_END                    (then evaluation and CHECKPOINT again, for epoch intervals)
    FIT_END

The Engine runs algorithms first, then callbacks. On "after" events (AFTER_* and *_END)
algorithms run in reverse order, so that an algorithm that wrapped something on the way in
unwraps it on the way out, like nested context managers.
"""
from __future__ import annotations

from enum import Enum


class Event(str, Enum):
    INIT = "init"
    FIT_START = "fit_start"
    EPOCH_START = "epoch_start"
    BEFORE_DATALOADER = "before_dataloader"
    AFTER_DATALOADER = "after_dataloader"
    BATCH_START = "batch_start"
    BEFORE_FORWARD = "before_forward"
    AFTER_FORWARD = "after_forward"
    BEFORE_LOSS = "before_loss"
    AFTER_LOSS = "after_loss"
    BEFORE_BACKWARD = "before_backward"
    AFTER_BACKWARD = "after_backward"
    BEFORE_OPTIM_STEP = "before_optim_step"
    AFTER_OPTIM_STEP = "after_optim_step"
    BATCH_END = "batch_end"
    EVAL_START = "eval_start"
    EVAL_BATCH_START = "eval_batch_start"
    EVAL_BATCH_END = "eval_batch_end"
    EVAL_END = "eval_end"
    CHECKPOINT = "checkpoint"
    EPOCH_END = "epoch_end"
    FIT_END = "fit_end"
    # prediction (Trainer.predict) uses its own small set
    PREDICT_START = "predict_start"
    PREDICT_BATCH_END = "predict_batch_end"
    PREDICT_END = "predict_end"

    @property
    def is_after(self) -> bool:
        """True for events on which algorithms run in reverse order."""
        return self.value.startswith("after_") or self.value.endswith("_end")

    def __str__(self) -> str:  # so f"{event}" prints "batch_end"
        return self.value
