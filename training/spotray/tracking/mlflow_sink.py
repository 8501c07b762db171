"""MLflow: one run per spotray run, written with ``MlflowClient.log_batch``.

Synchronously, on the follower's own thread: the follower moves its cursor only past what the server took. A row
sent again after a failure carries the same timestamps, and MLflow's store keeps one copy of identical points."""

from __future__ import annotations

import json
import os
import time

from spotray.config import MlflowSection
from spotray.tracking.feed import Row
from spotray.tracking.state import Cursor

# The follower retries at every poll by itself: the client's own retries (7, with a doubling backoff) would hold a
# poll for minutes, and the run's end with it. And the client would print the run's URL on stdout when it ends.
CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
              "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
STEP_METRIC = "train/loss"  # logged at every step: its last step is the last step the run holds
FINISHED, LEFT = "FINISHED", "KILLED"  # a driver that stops before the run finishes leaves the run KILLED


class MlflowSink:
    def __init__(self, section: MlflowSection, cursor: Cursor, run_name: str, run_url: str):
        for name, value in CLIENT_ENV.items():
            os.environ.setdefault(name, value)
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=section.uri)
        self.logged_step: int | None = None
        if cursor.run_id is None:
            experiment = self.client.get_experiment_by_name(section.experiment)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(
                section.experiment)
            cursor.run_id = self.client.create_run(experiment_id, run_name=run_name,
                                                   tags={"spotray.run": run_url}).info.run_id
        else:
            self.client.update_run(cursor.run_id, status="RUNNING")
            history = self.client.get_metric_history(cursor.run_id, STEP_METRIC)
            self.logged_step = max((metric.step for metric in history), default=None)
        self.run_id = cursor.run_id

    def params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        self.client.log_batch(self.run_id, params=[Param(k, v[:MAX_PARAM_VAL_LENGTH]) for k, v in params.items()],
                              synchronous=True)

    def rows(self, rows: list[Row]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(name, value, int(row.time * 1000), row.step) for row in rows
                   for name, value in row.metrics.items()]
        self.client.log_batch(self.run_id, metrics=metrics, synchronous=True)

    def events(self, events: list[dict], new_from: int) -> None:
        from mlflow.entities import RunTag

        tags = [RunTag(f"spotray.ending.{n}", json.dumps(event)) for n, event in enumerate(events, 1)]
        self.client.log_batch(self.run_id, tags=tags[new_from:], synchronous=True)

    def summary(self, scalars: dict) -> None:
        from mlflow.entities import Metric, RunTag

        now_ms, step = int(time.time() * 1000), int(scalars.get("final_step", 0))
        numbers = {k: v for k, v in scalars.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        self.client.log_batch(
            self.run_id, metrics=[Metric(f"summary/{k}", float(v), now_ms, step) for k, v in numbers.items()],
            tags=[RunTag(f"spotray.reports.summary.{k}", str(v)) for k, v in scalars.items() if k not in numbers],
            synchronous=True)

    def flush(self) -> None:
        pass  # every call above returned once the server had it

    def close(self, finished: bool) -> None:
        self.client.set_terminated(self.run_id, status=FINISHED if finished else LEFT)
