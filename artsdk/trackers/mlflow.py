"""MLflow: one run per session in the experiment named after the project, metrics logged
by step; ``tracking_uri`` picks the store (a file store, ``<home>/mlruns``, by default; any
MLflow tracking URI works, a database or a server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional


class MLflow:
    def __init__(self, model: Any, *, home: Optional[str] = None, tracking_uri: Optional[str] = None,
                 experiment: Optional[str] = None) -> None:
        import os

        uri = tracking_uri or (Path(home or ".artsdk").resolve() / "mlruns").as_uri()
        if uri.startswith("file:"):  # MLflow 3 asks for this to write a file store (it prefers a database now)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        name = experiment or model.project
        found = self.client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=model.name,
                                             tags={"base_model": model.base_model}).info.run_id
        self.tracking_uri = uri

    def log(self, model: Any, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        import time

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()
                                                    if v == v])  # NaN: not a value MLflow takes

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
