"""MLflow logger (the `mlflow` extra: pip install 'hasten[mlflow]').

Metrics go to one MLflow run through `MlflowClient` (no global MLflow state is touched), with
hasten's batch as the step; the recipe (or the hparams a Trainer is given) as the run's
parameters, flattened to dotted keys. A tracking URI names the store: a server
(`http://host:5000`), a database (`sqlite:///mlflow.db`, which needs `sqlalchemy` and
`alembic`, both in the extra) or the environment's `MLFLOW_TRACKING_URI` when none is given.
A resumed run continues the same MLflow run when given its `run_id` (hasten train keeps it
in the run folder).
"""
from __future__ import annotations

import importlib.util
import time
from typing import Any

from .base import LoggerDestination


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
