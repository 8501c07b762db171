"""End to end: a real local Ray cluster with metrics export runs a short ``spotray train``; a real Prometheus
scrapes every node's metrics endpoint with the PodMonitors' relabelling and evaluates the alert rules; then every
panel query of the spotray training dashboard and of Ray's Train dashboard is asked of it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from infra.kernel.config import AlertThresholds
from monitoring.dashboards import panel_queries, ray_dashboards, training_dashboard
from monitoring.monitors import relabelings
from monitoring.rules import rule_groups
from spotray.drills.cluster import LocalCluster
from spotray.ray_local import free_port
from tests.monitoring.prom import as_promql, binary, rules_file

CLUSTER = "e2e-cluster"
# Panels with no data in a CPU run, and why.
TRAINING_EXCEPTIONS = {
    "MFU": "no peak FLOP/s is known for a CPU",
    "Recovery time (interruption to first resumed step)": "nothing interrupts this run",
    "Emergency checkpoint at the last notice (1 committed, 0 not)": "no preemption notice in this run",
    "GPU utilisation": "no GPU, so no DCGM exporter",
    "GPU memory used": "no GPU, so no DCGM exporter",
}
_NO_RAY_DATA = "spotray reads its token shards itself, not through Ray Data"
RAY_TRAIN_EXCEPTIONS = {
    "GPU Usage": "no GPU", "GPU Memory Usage": "no GPU",
    "Cumulative Checkpoint Transfer Time": "spotray saves checkpoints itself, never through ray.train.report",
    **dict.fromkeys(["Max Exposed Data Loading Time", "Percentage Data Loading Breakdown by Stage",
                     "Data Ingest Throughput by Rank", "Data Production Throughput", "Production Wait Time by Rank",
                     "Data Transfer Time by Rank", "Batching Time by Rank", "Format Time by Rank",
                     "Collate Time by Rank", "Finalize Time by Rank"], _NO_RAY_DATA),
}

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]


def prometheus_config(cluster: LocalCluster, rules: Path) -> dict:
    targets = [{"targets": [f"127.0.0.1:{node.metrics_port}"],
                "labels": {"__meta_kubernetes_pod_label_ray_io_cluster": CLUSTER,
                           "__meta_kubernetes_pod_label_ray_io_node_type": "head" if node.name == "head" else "worker",
                           "pod": node.name}}
               for node in cluster.nodes]
    relabel = [{"source_labels": r["sourceLabels"], "target_label": r["targetLabel"]} for r in relabelings()]
    return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "ray", "static_configs": targets, "relabel_configs": relabel}]}


class Prometheus:
    def __init__(self, workdir: Path, config: dict):
        self.port = free_port()
        (workdir / "prometheus.yaml").write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [binary("prometheus"), f"--config.file={workdir / 'prometheus.yaml'}",
             f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while not self._ready():
            assert time.time() < deadline and self.proc.poll() is None, f"Prometheus did not start: {self.log.name}"
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        assert body["status"] == "success", body
        return body["data"]

    def series(self, expr: str, at: float) -> list:
        return self.api("query", query=expr, time=f"{at:.3f}")["result"]

    def series_over(self, expr: str, start: float, end: float) -> list:
        """What a Grafana panel shows for the window: a range query."""
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")["result"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def train_config(workdir: Path, dataset_url: str) -> Path:
    # evaluates on its own training data (data.val_path): the validation loss panel needs a run that evaluates;
    # names its (local) nodes and their prices, so that it bills them and exports the Cost row's gauges;
    # takes in-memory snapshots (off by default), so that their panels have data
    config = {"data": {"path": dataset_url, "val_path": dataset_url}, "eval": {"every_steps": 50, "samples": 24},
              "cost": {"prices": {"m7i.xlarge": {"spot": 0.08, "on-demand": 0.2016}}, "example_prices": True,
                       "node": {"instance_type": "m7i.xlarge", "capacity_type": "spot", "zone": "us-west-2a"}},
              "checkpoint": {"path": str(workdir / "ckpt"), "every_steps": 25}, "snapshot": {"every_steps": 10},
              "run": {"name": "e2e"}, "model": {"preset": "tiny"}, "scaling": {"num_workers": 2},
              "train": {"seq_len": 32, "global_batch_size": 12, "max_steps": 200, "warmup_steps": 5, "log_every": 5}}
    path = workdir / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_dashboards_have_data_and_rules_evaluate_on_a_real_prometheus(tmp_path, dataset_url):
    rules = rules_file(rule_groups(AlertThresholds()), tmp_path)
    with LocalCluster(tmp_path / "ray").start(workers=2) as cluster:  # reports metrics every second (conftest)
        prometheus = Prometheus(tmp_path, prometheus_config(cluster, rules))
        try:
            log = tmp_path / "train.log"
            config = train_config(tmp_path, dataset_url)
            started = time.time()
            proc = subprocess.Popen([sys.executable, "-m", "spotray.cli", "train", "--config", str(config)],
                                    env={**cluster.node_env(), "RAY_ADDRESS": cluster.address},
                                    stdout=log.open("w"), stderr=subprocess.STDOUT)
            seen_at = _last_time_with(prometheus, "count(ray_spotray_checkpoint_step)", proc)
            assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
            assert seen_at, f"no checkpointed run reached Prometheus; see {log}"
            time.sleep(3)  # Ray exports the worker group's shutdown time as the run ends
            window = (started, time.time())
            clusters = prometheus.series_over("count by (ray_io_cluster, ray_node_type) (up)", *window)
            assert {(s["metric"]["ray_io_cluster"], s["metric"]["ray_node_type"]) for s in clusters} == {
                (CLUSTER, "head"), (CLUSTER, "worker")}, "the PodMonitors' relabelling did not apply"
            _assert_panels_have_data(prometheus, training_dashboard().model, window, TRAINING_EXCEPTIONS)
            train_board = next(b for b in ray_dashboards() if b.slug == "ray-train").model
            _assert_panels_have_data(prometheus, train_board, window, RAY_TRAIN_EXCEPTIONS)
            evaluated = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
            assert len(evaluated) == sum(len(g["rules"]) for g in rule_groups(AlertThresholds()))
            assert all(r["health"] == "ok" and not r.get("lastError") for r in evaluated), evaluated
        finally:
            prometheus.stop()


def _last_time_with(prometheus: Prometheus, expr: str, proc: subprocess.Popen) -> float | None:
    """The last moment, while ``proc`` ran, at which ``expr`` had a result."""
    seen_at = None
    while proc.poll() is None:
        now = time.time()
        if prometheus.series(expr, now):
            seen_at = now
        time.sleep(1)
    return seen_at


def _assert_panels_have_data(prometheus: Prometheus, model: dict, window: tuple[float, float],
                             exceptions: dict[str, str]) -> None:
    """Every query of every panel not excepted has a series in the run's window."""
    queries = panel_queries(model)
    titles = {title for title, _ in queries}
    assert set(exceptions) <= titles, f"exceptions name panels that do not exist: {set(exceptions) - titles}"
    empty = sorted({title for title, expr in queries
                    if title not in exceptions and not prometheus.series_over(as_promql(expr), *window)})
    assert empty == [], f"panels without data: {empty}"
