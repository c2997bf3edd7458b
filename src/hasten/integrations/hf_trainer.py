"""hasten's methods inside the Hugging Face Trainer: `HastenTrainer`, a `transformers.Trainer`
subclass (a TrainerCallback alone cannot change the batch or the loss), and Muon as the
single optimizer the HF Trainer takes.

    pip install 'hasten[hf]'
    from hasten.algorithms import EMA, LabelSmoothing, SeqLenWarmup
    from hasten.integrations.hf import HastenTrainer, muon_optimizer

    trainer = HastenTrainer(model=model, args=TrainingArguments(...), train_dataset=..., eval_dataset=...,
                            algorithms=[LabelSmoothing(0.1), EMA(half_life="0.1dur")],
                            optimizers=(muon_optimizer(model, muon_lr=0.02, adam_lr=3e-3), None))
    trainer.train()

Where each method acts (hasten.integrations.host has the list): model surgery when the
HastenTrainer is made, before any optimizer the HF Trainer builds (an optimizer passed in
`optimizers=` must then still hold the model's parameters: it is checked); methods that
change the batch at the start of each `training_step`, on the (inputs, labels) view of the
batch dict (`pixel_values` or `input_ids`, and `labels`); clipping before each optimizer
step (`on_pre_optimizer_step`); EMA, SWA, Lookahead, layer freezing and gradual pruning
after it; EMA and SWA evaluate their average in `evaluate` and, at the end of training,
keep it only if it evaluates better (by `eval_loss`). Methods that act through the loss
(label smoothing, MixUp's mixed targets) make the HastenTrainer compute the training loss
itself from the model's logits, with hasten's loss seam and the HF Trainer's reduction (the
sum over the targets that count divided by their number over the accumulated
micro-batches); a causal LM's labels are shifted as its own loss shifts them; evaluation
keeps the model's own loss. Refused when the HastenTrainer is made, with the reason: SAM,
selective backprop, proxy selection, InfoBatch, TTA, patch whitening, chunked cross-entropy.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

try:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
except ImportError as e:   # pragma: no cover - depends on the environment
    raise ImportError("HastenTrainer needs transformers and accelerate: pip install 'hasten[hf]'") from e

from ..algorithms._averaging import WeightAverage
from ..core import Algorithm
from ..loss import default_loss, logits_of
from ..optim.combined import CombinedOptimizer
from ..optim.muon import muon_optimizers
from .host import HostLoop, mean_over_targets

HOST = "the Hugging Face Trainer"
_CAUSAL = frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def muon_optimizer(model: torch.nn.Module, **kwargs) -> CombinedOptimizer:
    """hasten's Muon (hidden matrices and conv kernels) with AdamW on the rest, as the one
    optimizer the HF Trainer takes: `HastenTrainer(..., optimizers=(muon_optimizer(model), None))`
    (the HF Trainer then builds its schedule over both). Keywords as hasten.functional.muon_optimizers."""
    return CombinedOptimizer(muon_optimizers(model, **kwargs))


def _input_key(inputs: dict) -> str:
    for key in ("pixel_values", "input_ids", "inputs_embeds", "input_values"):
        if key in inputs:
            return key
    raise ValueError(f"{HOST}: hasten finds no model input in the batch (keys {sorted(inputs)}); it reads "
                     "pixel_values, input_ids, inputs_embeds or input_values")


class _Events(transformers.TrainerCallback):
    """The HF Trainer's loop events, passed on to the HastenTrainer's HostLoop."""

    def __init__(self, trainer: "HastenTrainer"):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        t = self.trainer
        epochs = max(1, math.ceil(state.num_train_epochs or 1))
        t.hasten.fit_start(state.max_steps, max(1, state.max_steps // epochs), [t.optimizer],
                           train_dataloader=None)
        t._train_loss = t.hasten.training_loss(default_loss)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.trainer.hasten.epoch_start()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.trainer.hasten.before_optim_step()

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.hasten.after_step()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.trainer.hasten.epoch_end()

    def on_train_end(self, args, state, control, **kwargs):
        t = self.trainer
        undecided = [a for a in t.hasten.algorithms if isinstance(a, WeightAverage) and a.final_swap
                     and not a._decided and a.has_average()]
        if undecided and t.hasten.state.evaluate is not None:
            t.evaluate()   # the final evaluation, where EMA and SWA keep the better of average and trained weights
        t.hasten.fit_end()


class HastenTrainer(transformers.Trainer):
    """A `transformers.Trainer` that runs hasten Algorithms (`algorithms=`); every other
    argument is the HF Trainer's. See the module doc for where each method acts.
    `host_allocator="auto"` tunes glibc malloc when training on a CPU, as `hasten train` does
    (process-wide, so off unless asked; hasten.allocator says what it sets)."""

    def __init__(self, *args, algorithms: Sequence[Algorithm] = (), host_allocator: str = "default", **kwargs):
        targs = kwargs.get("args") if "args" in kwargs else (args[1] if len(args) > 1 else None)
        model = kwargs.get("model") if "model" in kwargs else (args[0] if args else None)
        if model is None:
            raise ValueError("HastenTrainer needs model= (model_init is not supported: hasten's model surgery "
                             "acts on the model once)")
        seed = targs.seed if targs is not None else 42
        self.hasten = HostLoop(algorithms, HOST, seed=seed, host_allocator=host_allocator)
        precision = ("bf16-mixed" if targs is not None and targs.bf16 else
                     "fp16-mixed" if targs is not None and targs.fp16 else "fp32")
        device = targs.device if targs is not None else "cpu"
        self.hasten.setup(model, device=device, precision=precision, evaluate=self._evaluate_unobserved,
                          quality=("val/loss", "min"))   # INIT: model surgery before any optimizer is built
        optimizer = (kwargs.get("optimizers") or (None, None))[0]
        if optimizer is not None:
            mine = {id(p) for p in model.parameters()}
            foreign = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in mine]
            if foreign:
                raise ValueError(f"HastenTrainer: the optimizer passed in optimizers= holds {len(foreign)} tensors that "
                                 "hasten's model surgery replaced; pass optimizer_cls_and_kwargs instead, or build the "
                                 "optimizer after the surgery")
        self._loss_methods = [a for a in self.hasten.algorithms if type(a).wrap_loss is not Algorithm.wrap_loss]
        self._train_loss = None
        self._observed = True
        super().__init__(*args, **kwargs)
        if self.eval_dataset is None:   # nothing to judge an average by: EMA and SWA put it in and say so
            self.hasten.state.evaluate = None
        self.add_callback(_Events(self))

    # ------------------------------------------------------------------ the batch
    def training_step(self, model, inputs, num_items_in_batch=None):
        inputs = self._hasten_batch(inputs)
        return super().training_step(model, inputs, num_items_in_batch)

    def _hasten_batch(self, inputs: dict) -> dict:
        key = _input_key(inputs)
        x, y = inputs[key], inputs.get("labels")
        out = self.hasten.batch((x, y))
        new_x, new_y = out[0], out[1]
        if new_x is x and new_y is y:
            return inputs
        inputs = dict(inputs)
        old_shape = tuple(x.shape)
        inputs[key], inputs["labels"] = new_x, new_y
        for k, v in list(inputs.items()):
            if k in (key, "labels") or not isinstance(v, torch.Tensor) or tuple(v.shape) != old_shape:
                continue
            if tuple(new_x.shape) == old_shape:
                continue
            if k == "attention_mask" and bool(v.all()):
                inputs[k] = torch.ones(new_x.shape, dtype=v.dtype, device=v.device)
            else:
                raise ValueError(f"{HOST}: a hasten method changed the shape of {key} from {old_shape} to "
                                 f"{tuple(new_x.shape)}, and the batch's {k} cannot follow; drop that method")
        return inputs

    # ------------------------------------------------------------------ the loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not (model.training and self._loss_methods and self._train_loss is not None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = logits_of(outputs)
        core = self.accelerator.unwrap_model(model)
        if type(core).__name__ in _CAUSAL:   # the model's own loss predicts token t+1 from t
            logits = logits[:, :-1]
            labels = tuple(t[:, 1:] for t in labels) if isinstance(labels, tuple) else labels[:, 1:]
        losses = self._train_loss(logits, labels)
        loss = mean_over_targets(losses, labels, num_items_in_batch)   # as the model's own loss reduces
        return (loss, outputs) if return_outputs else loss

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, *args, **kwargs):
        if not self._observed:
            return super().evaluate(*args, **kwargs)
        self.hasten.eval_start()
        metrics = super().evaluate(*args, **kwargs)
        prefix = kwargs.get("metric_key_prefix", "eval")
        self.hasten.eval_end({"val/loss": metrics.get(f"{prefix}_loss", float("nan")), **metrics})
        return metrics

    def _evaluate_unobserved(self) -> dict:
        """What EMA and SWA judge the average by at the end: eval_loss, no hasten events."""
        self._observed = False
        try:
            metrics = super().evaluate()
        finally:
            self._observed = True
        return {"val/loss": metrics.get("eval_loss", float("nan"))}


__all__ = ["HastenTrainer", "muon_optimizer"]
