"""The Karpenter queries of the dashboards and rules against what the pinned Karpenter (v1.14.1) exports: metric names
and label names from its source (``karpenter-v1.14.1-metrics.json``, which names the repositories and commits), and
the cluster dashboard's Karpenter panels evaluated by promtool on series shaped as Karpenter exports them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from infra.kernel.config import AlertThresholds
from infra.kernel.versions import KARPENTER
from monitoring.dashboards import all_dashboards, cluster_dashboard, panel_queries
from monitoring.rules import rule_groups
from tests.monitoring.prom import promtool, rules_file

EXPORTED = json.loads((Path(__file__).with_name(f"karpenter-v{KARPENTER.version}-metrics.json")).read_text())
_SERIES_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
_METRIC = re.compile(r"\bkarpenter_[a-z0-9_]+")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_MATCHERS = re.compile(r"\{([^}]*)\}")
_MATCHER_LABEL = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")


def exported_series() -> set[str]:
    """Every series name Karpenter's metrics are scraped as."""
    names = set()
    for name, kind in EXPORTED["metrics"].items():
        names |= {name, *(name + suffix for suffix in _SERIES_SUFFIXES.get(kind, ()))}
    return names


def every_expression() -> list[tuple[str, str]]:
    """(where, PromQL) of every dashboard panel query and every rule."""
    found = [(f"{board.slug}: {title}", expr) for board in all_dashboards()
             for title, expr in panel_queries(board.model)]
    return found + [(f"rule {r.get('alert') or r.get('record')}", r["expr"]) for g in rule_groups(AlertThresholds())
                    for r in g["rules"]]


def unknown_metrics(expressions: list[tuple[str, str]]) -> list[str]:
    exported = exported_series()
    return sorted({f"{where}: {m}" for where, expr in expressions for m in _METRIC.findall(expr) if m not in exported})


def labels_used(expr: str) -> set[str]:
    """Label names an expression groups, joins or matches on."""
    used = {label.strip() for names in _LABEL_LISTS.findall(expr) for label in names.split(",") if label.strip()}
    return used | {label for matchers in _MATCHERS.findall(expr) for label in _MATCHER_LABEL.findall(matchers)}


def test_the_metric_list_is_the_pinned_karpenters_and_holds_what_the_cost_needs():
    assert KARPENTER.version == "1.14.1" and "v1.14.1" in EXPORTED["source"]
    assert {"kubernetes-sigs/karpenter", "aws/karpenter-provider-aws"} <= set(re.findall(r"[\w-]+/[\w-]+",
                                                                                          EXPORTED["source"]))
    assert EXPORTED["metrics"]["karpenter_cloudprovider_instance_type_offering_price_estimate"] == "gauge"
    assert EXPORTED["metrics"]["karpenter_nodes_allocatable"] == "gauge"
    assert set(EXPORTED["labels"]) <= set(EXPORTED["metrics"])


def test_every_karpenter_metric_a_dashboard_or_rule_queries_is_one_the_pinned_karpenter_exports():
    expressions = every_expression()
    used = {m for _, expr in expressions for m in _METRIC.findall(expr)}
    assert {"karpenter_nodes_allocatable", "karpenter_cloudprovider_instance_type_offering_price_estimate"} <= used
    assert unknown_metrics(expressions) == []


@pytest.mark.parametrize("wrong", [
    "karpenter_cloudprovider_instance_type_price_estimate",  # its name before Karpenter v1
    "karpenter_nodes_allocatable_total", "karpenter_nodepool_usage"])
def test_a_name_karpenter_does_not_export_is_caught(wrong):
    assert unknown_metrics([("panel", f"sum({wrong})")]) == [f"panel: {wrong}"]
    assert unknown_metrics([("panel", "sum(rate(karpenter_pods_startup_duration_seconds_count[5m]))")]) == []


def test_every_label_a_karpenter_query_uses_is_a_label_of_the_karpenter_metrics_it_reads():
    checked = 0
    for where, expr in every_expression():
        metrics = set(_METRIC.findall(expr))
        if not metrics or "kube_" in expr:
            continue
        assert metrics <= set(EXPORTED["labels"]), f"{where}: look up the labels of {metrics} in Karpenter's source"
        known = set().union(*(EXPORTED["labels"][m] for m in metrics))
        assert labels_used(expr) - known == set(), where
        checked += 1
    assert checked >= 3
    assert labels_used('sum by (nodepool) (karpenter_nodes_allocatable{node="a"})') == {"nodepool", "node"}


# Series as Karpenter v1.14.1 exports them, with the target labels the chart's ServiceMonitor adds. Karpenter's
# state holds every node, so the core node group's node is there too, managed="false", with no pool or capacity type.
_TARGET = {"job": "karpenter", "namespace": "kube-system", "pod": "karpenter-7d9f-abcde", "instance": "10.0.3.9:8080"}
_NODES = [  # node_name, nodepool, capacity_type, instance_type, zone, managed, {resource: allocatable}
    ("ip-10-0-1-1", "a10g-spot", "spot", "g5.xlarge", "us-west-2a", "true", {"cpu": 3.92, "nvidia.com/gpu": 1}),
    ("ip-10-0-1-2", "a10g-spot", "spot", "g5.xlarge", "us-west-2a", "true", {"cpu": 3.92, "nvidia.com/gpu": 1}),
    ("ip-10-0-2-1", "h100-spot", "on-demand", "p5.48xlarge", "us-west-2b", "true",
     {"cpu": 191.45, "nvidia.com/gpu": 8}),
    ("ip-10-0-3-1", "", "", "m7i.xlarge", "us-west-2a", "false", {"cpu": 3.92}),
]
_PRICES = [("g5.xlarge", "spot", "us-west-2a", 0.5), ("g5.xlarge", "spot", "us-west-2b", 0.625),
           ("g5.xlarge", "on-demand", "us-west-2a", 1.0), ("p5.48xlarge", "on-demand", "us-west-2b", 98.25),
           ("p5.48xlarge", "spot", "us-west-2b", 40.0), ("m7i.xlarge", "on-demand", "us-west-2a", 0.25)]
# What each Karpenter panel of the cluster dashboard must show for them: (panel title, legend) -> samples.
_EXPECTED: dict[tuple[str, str], list[tuple[str, float]]] = {
    ("Nodes by capacity type", "{{capacity_type}}"): [('{capacity_type="spot"}', 2),
                                                      ('{capacity_type="on-demand"}', 1)],
    ("Nodes by capacity type", "core (managed node group)"): [("{}", 1)],
    ("GPUs by pool", "{{nodepool}} {{capacity_type}}"): [('{capacity_type="spot", nodepool="a10g-spot"}', 2),
                                                         ('{capacity_type="on-demand", nodepool="h100-spot"}', 8)],
    ("Cost rate of Karpenter's nodes (its price estimates)", "{{nodepool}} {{capacity_type}} $/h"): [
        ('{capacity_type="spot", nodepool="a10g-spot"}', 1.0),
        ('{capacity_type="on-demand", nodepool="h100-spot"}', 98.25)],
    ("Cost rate of Karpenter's nodes (its price estimates)", "all $/h"): [("{}", 99.25)],
}


def _series(name: str, labels: dict[str, str], value: float) -> dict:
    """A series with every label the metric has (others empty, as Karpenter leaves them) and the target's."""
    full = {**dict.fromkeys(EXPORTED["labels"][name], ""), **labels, **_TARGET}
    matchers = ", ".join(f'{k}="{v}"' for k, v in sorted(full.items()) if v != "")
    return {"series": f"{name}{{{matchers}}}", "values": f"{value}+0x10"}


def _input_series() -> list[dict]:
    series = []
    for node, pool, capacity, instance_type, zone, managed, resources in _NODES:
        labels = {"node_name": node, "nodepool": pool, "capacity_type": capacity, "instance_type": instance_type,
                  "zone": zone, "region": "us-west-2", "managed": managed, "arch": "amd64", "os": "linux",
                  "instance_family": instance_type.split(".")[0], "instance_size": instance_type.split(".")[1]}
        series += [_series("karpenter_nodes_allocatable", {**labels, "resource_type": resource}, amount)
                   for resource, amount in resources.items()]
        series.append({"series": f'kube_node_info{{node="{node}", job="kube-state-metrics"}}', "values": "1+0x10"})
    name = "karpenter_cloudprovider_instance_type_offering_price_estimate"
    series += [_series(name, {"instance_type": t, "capacity_type": c, "zone": z}, price) for t, c, z, price in _PRICES]
    return series


def test_the_cluster_dashboards_karpenter_panels_count_and_price_karpenters_nodes(tmp_path):
    targets = [(panel["title"], target["legendFormat"], target["expr"]) for panel in cluster_dashboard().model["panels"]
               for target in panel.get("targets", []) if "karpenter_" in target["expr"]]
    assert {(title, legend) for title, legend, _ in targets} == set(_EXPECTED)
    tests = [{"expr": expr, "eval_time": "5m",
              "exp_samples": [{"labels": labels, "value": value} for labels, value in _EXPECTED[(title, legend)]]}
             for title, legend, expr in targets]
    empty = rules_file([], tmp_path, "empty.yaml")
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": [empty.name], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": _input_series(), "promql_expr_test": tests}]}))
    result = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
