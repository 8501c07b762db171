"""Dashboards as ConfigMaps Grafana's sidecar loads; every query in them and in the rules is PromQL promtool
parses; the training dashboard shows what the issue asks for, from gauges the training loop really exports."""

import json
import re

import ray

from infra.kernel.config import MonitoringConfig
from monitoring.dashboards import (
    CONFIG_MAP_LIMIT,
    DASHBOARD_LABEL,
    all_dashboards,
    cluster_dashboard,
    config_map,
    panel_queries,
    training_dashboard,
)
from monitoring.values import kube_prometheus_stack_values
from spotray.accounts.goodput import CATEGORIES
from spotray.worker.telemetry import GAUGES, MEMORY_GAUGE, TIME_GAUGE
from tests.monitoring.prom import as_promql, promtool, rules_file


def test_each_dashboard_is_a_labelled_config_map_under_the_size_limit_that_the_sidecar_loads():
    boards = all_dashboards()
    maps = [config_map(board, "monitoring") for board in boards]
    assert [b.slug for b in boards] == ["ray-default", "ray-train", "spotray-training", "spotray-cluster"]
    assert len({m["metadata"]["name"] for m in maps}) == len(maps)
    for cm in maps:
        assert cm["metadata"]["labels"] == DASHBOARD_LABEL
        assert sum(len(v.encode()) for v in cm["data"].values()) < CONFIG_MAP_LIMIT
    sidecar = kube_prometheus_stack_values(MonitoringConfig())["grafana"]["sidecar"]["dashboards"]
    assert {sidecar["label"]: sidecar["labelValue"]} == DASHBOARD_LABEL and sidecar["searchNamespace"] == "ALL"


def test_rays_dashboards_come_from_the_installed_ray():
    ray_boards = {b.slug: b.model for b in all_dashboards()[:2]}
    assert {m["uid"] for m in ray_boards.values()} == {"rayDefaultDashboard", "rayTrainDashboard"}
    assert all(f"rayVersion:{ray.__version__}" in m["tags"] for m in ray_boards.values())
    assert any("ray_train_" in expr for _, expr in panel_queries(ray_boards["ray-train"]))


def test_every_query_of_every_dashboard_is_valid_promql(tmp_path):
    queries = [as_promql(expr) for board in all_dashboards() for _, expr in panel_queries(board.model)]
    assert len(queries) > 100
    groups = [{"name": "dashboards", "rules": [{"record": f"query_{i}", "expr": q} for i, q in enumerate(queries)]}]
    result = promtool("check", "rules", str(rules_file(groups, tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr


def titles(model: dict) -> list[str]:
    return [title for title, _ in panel_queries(model)]


def test_the_training_dashboard_shows_every_measure_of_a_spot_run():
    model = training_dashboard().model
    joined = " | ".join(titles(model)).lower()
    for wanted in ("goodput", "badput", "tokens per second", "mfu", "loss", "step time", "checkpoint time",
                   "age of the newest committed checkpoint", "interruptions", "lost steps", "recovery time",
                   "gpu utilisation", "gpu memory", "validation loss", "worker memory", "cost so far",
                   "per million trained tokens", "on demand", "saving"):
        assert wanted in joined, wanted
    save_panel = next(p for p in model["panels"] if p.get("title") == "Checkpoint time")
    assert [t["legendFormat"].split()[0] for t in save_panel["targets"]] == ["save", "blocked", "restore"]


def test_a_cost_row_shows_the_runs_cost_gauges_by_run():
    model = training_dashboard().model
    rows = [p["title"] for p in model["panels"] if p.get("type") == "row"]
    assert rows[-1] == "Cost"
    after = model["panels"][[p.get("title") for p in model["panels"]].index("Cost") + 1:]
    shown = {(p["title"], p["fieldConfig"]["defaults"]["unit"], t["expr"]) for p in after for t in p["targets"]}
    for gauge, unit in (("cost_usd", "currencyUSD"), ("usd_per_million_tokens", "currencyUSD"),
                        ("on_demand_usd", "currencyUSD"), ("spot_saving_ratio", "percentunit")):
        assert any(u == unit and e == f'max by (run) (ray_spotray_{gauge}{{run=~"$run"}})' for _, u, e in shown), gauge
    assert "karpenter" not in json.dumps(model)  # the run's own figures; the cluster's cost rate is elsewhere


def test_the_training_dashboard_reads_only_gauges_the_training_loop_exports():
    used = {m for _, expr in panel_queries(training_dashboard().model)
            for m in re.findall(r"ray_spotray_(\w+)", expr)}
    assert used <= {*GAUGES, TIME_GAUGE, MEMORY_GAUGE}
    assert {*GAUGES, TIME_GAUGE, MEMORY_GAUGE} - used == set(), "every gauge has a panel"


def panel(model: dict, title: str) -> dict:
    return next(p for p in model["panels"] if p.get("title") == title)


def test_the_validation_loss_is_drawn_over_the_training_loss_per_run():
    targets = panel(training_dashboard().model, "Validation loss")["targets"]
    assert [(t["legendFormat"], t["expr"]) for t in targets] == [
        ("val {{run}}", 'max by (run) (ray_spotray_val_loss{run=~"$run"})'),
        ("train {{run}}", 'max by (run) (ray_spotray_loss{run=~"$run"})')]


def test_worker_memory_is_in_bytes_by_rank_and_kind():
    memory = panel(training_dashboard().model, "Worker memory")
    assert memory["fieldConfig"]["defaults"]["unit"] == "bytes"
    [target] = memory["targets"]
    assert target["expr"] == f'max by (run, rank, kind) (ray_spotray_{MEMORY_GAUGE}{{run=~"$run"}})'
    assert {"{{rank}}", "{{kind}}"} <= set(re.findall(r"\{\{\w+\}\}", target["legendFormat"]))


def test_the_badput_breakdown_shows_every_category_but_productive_eval_included():
    assert "eval" in CATEGORIES
    [expr] = [e for title, e in panel_queries(training_dashboard().model) if title.startswith("Badput")]
    numerator = expr.split(" / ")[0]
    # a series per category the time gauge has: the only matcher on category leaves out productive time alone
    assert "by (run, category)" in numerator
    assert re.findall(r'category\s*(=~|!~|!=|=)\s*"([^"]*)"', expr) == [("!=", "productive")]


def test_the_cluster_dashboard_shows_capacity_types_cost_rate_pending_pods_and_minio_health():
    queries = panel_queries(cluster_dashboard().model)
    by_title: dict[str, str] = {}
    for title, expr in queries:
        by_title[title.lower()] = f"{by_title.get(title.lower(), '')} {expr}"
    assert "count by (capacity_type)" in by_title["nodes by capacity type"]
    assert "karpenter_cloudprovider_instance_type_offering_price_estimate" in by_title[
        "cost rate of karpenter's nodes (its price estimates)"]
    assert 'phase="Pending"' in by_title["pending pods"]
    assert {"minio nodes", "minio drives offline", "minio usable capacity"} <= set(by_title)
