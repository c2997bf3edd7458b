"""The Trainer's arguments (and a host loop's: Lightning, the Hugging Face Trainer), checked
once before anything is built: algorithms, callbacks and loggers are instances of what they
claim, the loaders are sources of batches, the loss a function, the metrics metric objects.
A name, a class or a tensor given by mistake is a TypeError that names it and the fix, not an
AttributeError at the first event."""
from __future__ import annotations

import torch

from .core import Algorithm, Callback, Event
from .loggers.base import LoggerDestination

_KINDS = {   # what each list holds, how to tell, and an example of the right thing
    "algorithms": (lambda x: isinstance(x, Algorithm), "a hasten Algorithm", "algorithms=[EMA(half_life='0.1dur')]"),
    "callbacks": (lambda x: isinstance(x, Callback) or any(callable(getattr(x, e.value, None)) for e in Event),
                  "a Callback (an object with a method named after an event, e.g. batch_end)",
                  "callbacks=[EarlyStopping(...)]"),
    "loggers": (lambda x: isinstance(x, LoggerDestination) or callable(getattr(x, "log_metrics", None)),
                "a logger (an object with log_metrics)", "loggers=[JSONLLogger('metrics.jsonl')]"),
}


def check_loader(name: str, loader) -> None:
    """A tensor where batches go iterates row by row, without targets: say so at once."""
    if isinstance(loader, torch.Tensor) or (loader is not None and not hasattr(loader, "__iter__")):
        raise TypeError(f"{name}: a {type(loader).__name__} is not a source of batches; give a DataLoader or any "
                        "iterable of (inputs, targets), e.g. DataLoader(TensorDataset(x, y), batch_size=64)")


def check_arguments(train_dataloader, eval_dataloader, loss_fn, metrics) -> None:
    """What a slip of the keyword gives: a loss that is not a function, metrics that are not
    metric objects, a tensor where the batches go (it iterates row by row, without targets)."""
    check_loader("train_dataloader", train_dataloader)
    check_loader("eval_dataloader", eval_dataloader)
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn={loss_fn!r} is not a function; give loss_fn(outputs, targets) -> per-sample losses, "
                        "e.g. torch.nn.CrossEntropyLoss(reduction='none'), or leave it out for cross-entropy")
    if metrics is not None:
        if not isinstance(metrics, dict):
            raise TypeError(f"metrics={metrics!r}: give a dict of name -> metric object, e.g. "
                            "{'acc': torchmetrics.classification.MulticlassAccuracy(num_classes=10)}")
        for name, m in metrics.items():
            if not all(callable(getattr(m, a, None)) for a in ("update", "compute", "reset")):
                raise TypeError(f"metrics[{name!r}]: {m!r:.60} ({type(m).__name__}) is not a metric (update, compute "
                                "and reset, as torchmetrics' have); e.g. MulticlassAccuracy(num_classes=10)")


def listed(kind: str, items) -> list:
    """`items` as a list: None or one object alone is accepted (algorithms=EMA() works); anything
    that is not what `kind` holds is a TypeError that names it, raised here rather than as an
    AttributeError at the first event."""
    check, what, example = _KINDS[kind]

    def ok(x):
        return not isinstance(x, type) and check(x)
    if items is None:
        return []
    if ok(items):
        return [items]
    if isinstance(items, (str, bytes, dict)) or not hasattr(items, "__iter__"):
        raise TypeError(f"{kind}={items!r} is a {type(items).__name__}; give a list of instances, e.g. {example}")
    out = list(items)
    for x in out:
        if not ok(x):
            shown = x.__name__ if isinstance(x, type) else repr(x)
            hint = f"; {shown} is a class: give an instance, {shown}(...)" if isinstance(x, type) else ""
            raise TypeError(f"{kind}: {shown[:80]} ({type(x).__name__}) is not {what}{hint}; e.g. {example}")
    return out
