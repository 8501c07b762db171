"""Dashboards as ConfigMaps Grafana's sidecar loads; every query in them and in the rules is PromQL promtool
parses; the training dashboard shows what the issue asks for, from gauges the training loop really exports."""

import re

import ray

from spotray.infra.kernel.config import MonitoringConfig
from spotray.monitoring.dashboards import (
    CONFIG_MAP_LIMIT,
    DASHBOARD_LABEL,
    all_dashboards,
    cluster_dashboard,
    config_map,
    panel_queries,
    training_dashboard,
)
from spotray.monitoring.values import kube_prometheus_stack_values
from spotray.telemetry import GAUGES, TIME_GAUGE
from tests.monitoring.prom import as_promql, promtool, rules_file

PRICES = {"spot": 1.21, "on-demand": 4.1}


def test_each_dashboard_is_a_labelled_config_map_under_the_size_limit_that_the_sidecar_loads():
    boards = all_dashboards(PRICES)
    maps = [config_map(board, "monitoring") for board in boards]
    assert [b.slug for b in boards] == ["ray-default", "ray-train", "spotray-training", "spotray-cluster"]
    assert len({m["metadata"]["name"] for m in maps}) == len(maps)
    for cm in maps:
        assert cm["metadata"]["labels"] == DASHBOARD_LABEL
        assert sum(len(v.encode()) for v in cm["data"].values()) < CONFIG_MAP_LIMIT
    sidecar = kube_prometheus_stack_values(MonitoringConfig())["grafana"]["sidecar"]["dashboards"]
    assert {sidecar["label"]: sidecar["labelValue"]} == DASHBOARD_LABEL and sidecar["searchNamespace"] == "ALL"


def test_rays_dashboards_come_from_the_installed_ray():
    ray_boards = {b.slug: b.model for b in all_dashboards({})[:2]}
    assert {m["uid"] for m in ray_boards.values()} == {"rayDefaultDashboard", "rayTrainDashboard"}
    assert all(f"rayVersion:{ray.__version__}" in m["tags"] for m in ray_boards.values())
    assert any("ray_train_" in expr for _, expr in panel_queries(ray_boards["ray-train"]))


def test_every_query_of_every_dashboard_is_valid_promql(tmp_path):
    queries = [as_promql(expr) for board in all_dashboards(PRICES) for _, expr in panel_queries(board.model)]
    assert len(queries) > 100
    groups = [{"name": "dashboards", "rules": [{"record": f"query_{i}", "expr": q} for i, q in enumerate(queries)]}]
    result = promtool("check", "rules", str(rules_file(groups, tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr


def titles(model: dict) -> list[str]:
    return [title for title, _ in panel_queries(model)]


def test_the_training_dashboard_shows_every_measure_of_a_spot_run():
    model = training_dashboard(PRICES).model
    joined = " | ".join(titles(model)).lower()
    for wanted in ("goodput", "badput", "tokens per second", "mfu", "loss", "step time", "checkpoint time",
                   "age of the newest committed checkpoint", "interruptions", "lost steps", "recovery time",
                   "gpu utilisation", "gpu memory", "cost rate"):
        assert wanted in joined, wanted
    save_panel = next(p for p in model["panels"] if p.get("title") == "Checkpoint time")
    assert [t["legendFormat"].split()[0] for t in save_panel["targets"]] == ["save", "blocked", "restore"]
    cost = [expr for title, expr in panel_queries(model) if "cost" in title.lower()]
    assert len(cost) == 2 and any('capacity_type="spot"' in e and "* 1.21" in e for e in cost)
    assert "cost" not in " ".join(titles(training_dashboard({}).model)).lower()


def test_the_training_dashboard_reads_only_gauges_the_training_loop_exports():
    used = {m for _, expr in panel_queries(training_dashboard(PRICES).model)
            for m in re.findall(r"ray_spotray_(\w+)", expr)}
    assert used <= {*GAUGES, TIME_GAUGE}
    assert {*GAUGES, TIME_GAUGE} - used == set(), "every gauge has a panel"


def test_the_cluster_dashboard_shows_capacity_types_pending_pods_and_minio_health():
    queries = panel_queries(cluster_dashboard().model)
    by_title: dict[str, str] = {}
    for title, expr in queries:
        by_title[title.lower()] = f"{by_title.get(title.lower(), '')} {expr}"
    assert "count by (capacity_type)" in by_title["nodes by capacity type"]
    assert 'phase="Pending"' in by_title["pending pods"]
    assert {"minio nodes", "minio drives offline", "minio usable capacity"} <= set(by_title)
