"""The Ray PodMonitors: valid for prometheus-operator v0.93.1, selecting what KubeRay labels, on the ports the
RayJob builder opens, with the labels Ray's dashboards and our alerts filter on."""

import copy

import jsonschema
import pytest

from cluster.rayjob import JobSettings, rayjob
from infra.kernel.config import MonitoringConfig
from monitoring.monitors import ray_pod_monitors, relabelings
from monitoring.objects import monitoring_manifests
from spotray.config import load
from tests.schemas import validate_custom_resource

CRDS = {"PodMonitor": "prometheus-operator-v0.93.1_podmonitors.yaml",
        "PrometheusRule": "prometheus-operator-v0.93.1_prometheusrules.yaml"}


def custom_resources(cfg: MonitoringConfig) -> list[dict]:
    return [m for m in monitoring_manifests(cfg, "spotray") if m["kind"] in CRDS]


def test_every_monitor_and_rule_validates_against_the_operator_crds():
    objects = custom_resources(MonitoringConfig())
    assert sorted(o["kind"] for o in objects) == ["PodMonitor", "PodMonitor", "PrometheusRule"]
    for obj in objects:
        validate_custom_resource(obj, CRDS[obj["kind"]])
    broken = copy.deepcopy(objects[0])
    broken["spec"]["podMetricsEndpoints"][0]["relabelling"] = []  # misspelt: the schema must reject it
    with pytest.raises(jsonschema.ValidationError, match="relabelling"):
        validate_custom_resource(broken, CRDS["PodMonitor"])


def pod_ports_by_node_type() -> dict[str, set[str]]:
    cfg = load(None, ["data.path=s3://b/d", "checkpoint.path=s3://b/c", "run.name=m", "scaling.use_gpu=true"])
    spec = rayjob(cfg, JobSettings(image="registry.example/training:1", gpu_pool="a10g-spot"))["spec"]
    groups = {"head": spec["rayClusterSpec"]["headGroupSpec"],
              "worker": spec["rayClusterSpec"]["workerGroupSpecs"][0]}
    return {node_type: {p["name"] for c in group["template"]["spec"]["containers"] for p in c.get("ports", [])}
            for node_type, group in groups.items()}


def test_each_node_type_is_scraped_on_every_metrics_port_its_pods_open():
    ports = pod_ports_by_node_type()
    monitors = {m["spec"]["selector"]["matchLabels"]["ray.io/node-type"]: m for m in ray_pod_monitors("ns", {})}
    scraped = {t: [e["port"] for e in m["spec"]["podMetricsEndpoints"]] for t, m in monitors.items()}
    assert scraped == {"head": ["metrics", "as-metrics", "dash-metrics"], "worker": ["metrics"]}
    for node_type, names in scraped.items():
        assert set(names) <= ports[node_type]
    assert all(m["spec"]["namespaceSelector"] == {"matchNames": ["ns"]} for m in monitors.values())


def test_the_ray_cluster_label_becomes_ray_io_cluster_as_rays_dashboards_expect():
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_ray_io_cluster"], "targetLabel": "ray_io_cluster"} \
        in relabelings()
    for monitor in ray_pod_monitors("ns", {}):
        assert all(e["relabelings"] == relabelings() for e in monitor["spec"]["podMetricsEndpoints"])


@pytest.mark.parametrize(("cfg", "labels"), [
    (MonitoringConfig(release="prom"), {"release": "prom"}),
    (MonitoringConfig(mode="existing", selector_labels={"team": "ml"}), {"team": "ml"}),
])
def test_monitors_and_rules_carry_exactly_the_labels_prometheus_selects(cfg, labels):
    assert all(obj["metadata"]["labels"] == labels for obj in custom_resources(cfg))
