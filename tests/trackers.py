"""Experiment trackers for tests and drills: a real MLflow server on loopback, and readers that return what a
tracker holds of one series, each with the tracker's own reading code.

- ``mlflow_server_fixture``: import it into a test module to get the module-scoped fixture ``mlflow_server``, one
  real ``mlflow server``; the ``MlflowServer`` it yields has ``url``, ``stop()`` and ``start()``
  (the same port and database again: an outage of the tracker).
- ``*_points(...) -> [(step, value), ...]`` in the order the tracker holds them (duplicates kept: check with
  ``assert_one_point_per_step``); ``series(points) -> {step: value}``.
- Where a run's trackers are: ``mlflow_runs(uri, experiment)``, each spotray run's tagged ``spotray.run`` = its run
  URL; TensorBoard's ``<tracking.tensorboard.dir>/<run.name>``; W&B's ``<run_root>/wandb``, with the run id in
  ``spotray.tracking.state.load(run_root).cursors["wandb"].run_id``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotray.drills.mlflowlocal import MlflowServer
from spotray.drills.mlflowlocal import mlflow_server as start_mlflow_server


@pytest.fixture(scope="module", name="mlflow_server")
def mlflow_server_fixture(tmp_path_factory) -> Iterator[MlflowServer]:
    """One real ``mlflow server`` (SQLite store) per test module that imports this fixture."""
    with start_mlflow_server(tmp_path_factory.mktemp("mlflow")) as server:
        yield server


def series(points: list[tuple[int, float]]) -> dict[int, float]:
    return dict(points)


def assert_one_point_per_step(points: list[tuple[int, float]]) -> None:
    """Strictly increasing steps: no step twice, none out of order."""
    steps = [step for step, _ in points]
    assert steps == sorted(set(steps)), steps


# MLflow


def mlflow_runs(uri: str, experiment: str) -> list:
    """Every run of ``experiment`` (``mlflow.entities.Run``), oldest first."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id], order_by=["attributes.start_time ASC"])


def mlflow_points(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """A metric's history, in the order its points were logged."""
    from mlflow import MlflowClient

    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)
    return [(m.step, m.value) for m in sorted(history, key=lambda m: (m.timestamp, m.step))]


# TensorBoard


def tensorboard_points(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    """A scalar as TensorBoard shows it: every event file of ``log_dir``, with its purges applied."""
    return [(e.step, e.value) for e in _accumulator(log_dir).Scalars(tag)]


def tensorboard_texts(log_dir: Path, tag: str) -> list[tuple[int, str]]:
    """A text summary (``SummaryWriter.add_text(tag, ...)``) as (step, text)."""
    from tensorboard.util import tensor_util

    events = _accumulator(log_dir).Tensors(f"{tag}/text_summary")
    return [(e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode()) for e in events]


def _accumulator(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


# Weights & Biases (offline): wandb 0.31 no longer ships a Python reader of its transaction log, a LevelDB-style
# log of ``wandb_internal_pb2.Record`` messages (a 7-byte header ":W&B", 0xBEE1, version 0; then 32 KiB blocks of
# chunks, each with a 7-byte header: checksum, length, type FULL=1 FIRST=2 MIDDLE=3 LAST=4).

_BLOCK, _HEADER = 32768, 7


def wandb_records(path: Path) -> Iterator:
    """The ``Record`` messages of one ``run-<id>.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    position, message = _HEADER, b""
    while position + _HEADER <= len(data):
        room = _BLOCK - position % _BLOCK
        _, length, kind = struct.unpack("<IHB", data[position:position + _HEADER])
        if room < _HEADER or (length == 0 and kind == 0):  # the block's zero-filled trailer
            position += room
            continue
        message += data[position + _HEADER:position + _HEADER + length]
        position += _HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # protobuf makes it at import time
            record.ParseFromString(message)
            message = b""
            yield record


def wandb_files(wandb_dir: Path, run_id: str) -> list[Path]:
    """The run's transaction logs under ``wandb_dir`` (one per ``wandb.init``), in the order they were written."""
    files = list(wandb_dir.glob(f"offline-run-*-{run_id}*/run-{run_id}.wandb"))
    return sorted(files, key=lambda path: min((float(_item(r.history.item, "_timestamp")) for r in
                                               wandb_records(path) if r.HasField("history")), default=0.0))


def wandb_points(wandb_dir: Path, run_id: str, key: str) -> list[tuple[int, float]]:
    """A logged metric, as (W&B ``_step``, value), over every file of the run."""
    return [point for path in wandb_files(wandb_dir, run_id) for point in wandb_file_points(path, key)]


def wandb_file_points(path: Path, key: str) -> list[tuple[int, float]]:
    """A logged metric, as (W&B ``_step``, value), in one file."""
    rows = [record.history.item for record in wandb_records(path) if record.HasField("history")]
    return [(int(_item(items, "_step")), _item(items, key)) for items in rows if _item(items, key) is not None]


def wandb_summary(wandb_dir: Path, run_id: str) -> dict:
    """The run's summary: every update of every file, the later winning."""
    return _wandb_updates(wandb_dir, run_id, "summary")


def wandb_config(wandb_dir: Path, run_id: str) -> dict:
    return _wandb_updates(wandb_dir, run_id, "config")


def _wandb_updates(wandb_dir: Path, run_id: str, kind: str) -> dict:
    """The ``kind`` records' key updates (``summary`` or ``config``) over every file of the run, the later winning."""
    merged: dict = {}
    for path in wandb_files(wandb_dir, run_id):
        for record in wandb_records(path):
            if record.HasField(kind):
                merged.update({_key(item): json.loads(item.value_json) for item in getattr(record, kind).update})
    return merged


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def _item(items, key: str):
    return next((json.loads(item.value_json) for item in items if _key(item) == key), None)
