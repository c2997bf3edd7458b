"""MLflow logger (the `mlflow` extra: pip install 'hasten[mlflow]').

Metrics go to one MLflow run through `MlflowClient` (no global MLflow state is touched), with
hasten's batch as the step; the recipe (or the hparams a Trainer is given) as the run's
parameters, flattened to dotted keys. A tracking URI names the store: a server
(`http://host:5000`), a database (`sqlite:///mlflow.db`, which needs `sqlalchemy` and
`alembic`, both in the extra) or the environment's `MLFLOW_TRACKING_URI` when none is given.
A resumed run continues the same MLflow run when given its `run_id` (hasten train keeps it
in the run folder).

A tracker that is not there costs seconds, not minutes: unless the environment sets them,
hasten bounds MLflow's HTTP retries (`MLFLOW_HTTP_REQUEST_MAX_RETRIES` 2, backoff factor 1)
and a request's timeout (`MLFLOW_HTTP_REQUEST_TIMEOUT` 10 s); a local store (`sqlite:///`,
`file:` or a path) that is a folder where a file belongs, or cannot be written, is refused
before anything is made. What happens when logging fails during a run is the hub's
(hasten.loggers.base.LogHub, `trainer.on_logger_error`).
"""
from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

from .base import LoggerDestination, mapping_problem


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}: nested settings as the flat keys trackers take."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


# MLflow's HTTP client reads these when a request is made; set only where the user has not
BOUNDED_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
OPTIONS = {"tracking_uri": str, "experiment": str, "run_name": str, "run_id": str, "tags": dict}


def store_problem(uri: "str | None") -> "str | None":
    """What is wrong with a local tracking store before MLflow tries it (None: nothing seen)."""
    if not uri or "://" in uri and not uri.startswith(("sqlite:///", "file:")):
        return None   # a server (or the environment's URI): its answer is bounded by the retries above
    if uri.startswith("sqlite:///"):
        path, kind = Path(uri[len("sqlite:///"):]), "file"
    else:
        path, kind = Path(uri[len("file:"):].removeprefix("//") if uri.startswith("file:") else uri), "folder"
    if kind == "file" and path.is_dir():
        return f"{path} is a folder; an sqlite store is a file, e.g. sqlite:///{path / 'mlflow.db'}"
    if kind == "file" and not path.parent.exists():
        return f"the folder {path.parent} does not exist; make it first"
    if kind == "folder" and path.exists() and not path.is_dir():
        return f"{path} is a file; a file store is a folder"
    where = path if path.exists() else next((p for p in path.parents if p.exists()), Path("."))
    if not os.access(where, os.W_OK) or (kind == "file" and path.exists() and not os.access(path.parent, os.W_OK)):
        return f"{where} cannot be written; choose a store you can write"
    return None


def options_problem(options) -> "str | None":
    """What is wrong with trainer.mlflow's mapping, by key (None: nothing)."""
    problem = mapping_problem(options, OPTIONS)
    if problem or options is None:
        return problem
    problem = store_problem(options.get("tracking_uri"))
    return f"has tracking_uri {options['tracking_uri']}: {problem}" if problem else None


class MLflowLogger(LoggerDestination):
    @staticmethod
    def available() -> bool:
        return importlib.util.find_spec("mlflow") is not None

    def __init__(self, tracking_uri: str | None = None, experiment: str = "hasten", run_name: str | None = None,
                 run_id: str | None = None, tags: dict | None = None):
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.tracking import MlflowClient
        except ImportError as e:   # pragma: no cover - depends on the environment
            raise ImportError("MLflowLogger needs MLflow: pip install 'hasten[mlflow]'") from e
        problem = store_problem(tracking_uri)
        if problem:
            raise ValueError(f"tracking_uri {tracking_uri}: {problem}")
        for k, v in BOUNDED_HTTP.items():
            os.environ.setdefault(k, v)
        self._Metric, self._Param, self._RunTag = Metric, Param, RunTag
        self.client = MlflowClient(tracking_uri)
        if run_id is None:
            exp = self.client.get_experiment_by_name(experiment)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
            run = self.client.create_run(exp_id, run_name=run_name,
                                         tags={"hasten": "1", **{k: str(v) for k, v in (tags or {}).items()}})
            run_id = run.info.run_id
        self.run_id = run_id

    def log_metrics(self, metrics, step):
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self._Metric(k, float(v), now, int(step)) for k, v in metrics.items()])

    def log_hparams(self, hparams):
        flat = flatten(hparams)
        logged = self.client.get_run(self.run_id).data.params   # a resumed run: parameters cannot change
        params = [self._Param(k, str(v)[:6000]) for k, v in flat.items() if k not in logged]
        for i in range(0, len(params), 100):   # MLflow takes at most 100 parameters a batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def close(self):
        self.client.set_terminated(self.run_id)
