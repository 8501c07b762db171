"""kube-prometheus-stack and the monitors of every add-on: one selector, set once in the stack config."""

import json

import pytest

from infra.kernel.config import MonitoringConfig, from_values
from infra.plan import plan
from monitoring.values import kube_prometheus_stack_values
from spotray.errors import ConfigError
from tests.schemas import pinned_chart_values, unknown_values_keys

RELEASE = "kubernetes:helm.sh/v3:Release"


def releases(result) -> dict[str, dict]:
    return {r.inputs["name"]: r.inputs for r in result.of_type(RELEASE)}


# Where each add-on chart keeps the labels of its ServiceMonitor.
MONITOR_LABELS = {"kuberay-operator": ("metrics", "serviceMonitor", "additionalLabels"),
                  "dcgm-exporter": ("serviceMonitor", "additionalLabels"),
                  "minio": ("metrics", "serviceMonitor", "labels"),
                  "karpenter": ("serviceMonitor", "additionalLabels")}


def monitor_labels(values_by_release: dict[str, dict]) -> dict[str, dict]:
    found = {}
    for release, path in MONITOR_LABELS.items():
        if release in values_by_release:
            value = values_by_release[release]
            for key in path:
                value = value[key]
            found[release] = value
    return found


def test_every_value_set_exists_in_the_pinned_chart_or_its_grafana_subchart():
    defaults = pinned_chart_values("kube-prometheus-stack", "88.5.3")
    assert unknown_values_keys(kube_prometheus_stack_values(MonitoringConfig()), defaults) == []


def test_prometheus_keeps_the_configured_retention_on_its_own_volume_on_the_core_pool():
    spec = kube_prometheus_stack_values(MonitoringConfig(retention_days=30, storage_gib=200))["prometheus"][
        "prometheusSpec"]
    assert spec["retention"] == "30d"
    assert spec["storageSpec"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"] == "200Gi"
    assert spec["nodeSelector"] == {"spotray.dev/pool": "core"}


def test_every_part_of_the_stack_runs_on_the_core_pool_and_grafana_with_a_key_its_chart_has():
    values = kube_prometheus_stack_values(MonitoringConfig())
    placed = [values["prometheusOperator"], values["prometheus"]["prometheusSpec"],
              values["alertmanager"]["alertmanagerSpec"], values["grafana"]]
    assert all(part["nodeSelector"] == {"spotray.dev/pool": "core"} for part in placed)
    assert "nodeSelector" in pinned_chart_values("grafana", "12.11.1")


@pytest.mark.parametrize("stack", ["dev", "prod", "existing"])
def test_every_add_on_monitor_carries_the_label_the_installed_release_selects(stack_plans, stack):
    cfg, result = stack_plans[stack]
    found = releases(result)
    kps = found[cfg.monitoring.release]
    assert kps["chart"] == "kube-prometheus-stack" and kps["namespace"] == "monitoring"
    selector = kps["values"]["prometheus"]["prometheusSpec"]["serviceMonitorSelector"]["matchLabels"]
    assert selector == {"release": kps["name"]}  # the chart's own convention: the release's name
    labels = monitor_labels({name: inputs["values"] for name, inputs in found.items()})
    assert set(labels) >= {"kuberay-operator", "dcgm-exporter"}
    assert ("minio" in labels) == (cfg.storage.backend == "minio")
    assert ("karpenter" in labels) == (cfg.platform == "aws")
    assert all(value == selector for value in labels.values()), labels
    if cfg.platform == "aws":  # its node and price metrics: the cluster dashboard and the runs' prices
        assert found["karpenter"]["values"]["serviceMonitor"]["enabled"] is True


def test_the_add_ons_and_karpenter_wait_for_the_monitoring_crds(stack_plans):
    _, result = stack_plans["dev"]
    for component in ("kuberay", "gpu", "minio"):  # their children register only once they are ready
        assert "monitoring-chart" in result.named(component).depends_on, component
    assert "monitoring-chart" in result.named("karpenter-chart").depends_on  # its ServiceMonitor needs the CRD


def test_monitors_rules_and_dashboards_wait_for_the_monitoring_crds_and_the_training_namespace(stack_plans):
    _, result = stack_plans["dev"]
    waits_for = result.named("monitors").depends_on
    assert "monitoring-chart" in waits_for and "training-namespace" in waits_for


def test_grafanas_admin_password_is_generated_into_a_secret_and_never_shown(stack_plans):
    _, result = stack_plans["dev"]
    secret = next(r for r in result.of_type("kubernetes:core/v1:Secret") if r.inputs["metadata"]["name"] ==
                  "grafana-admin")
    assert secret.inputs["stringData"] == {"admin-user": "[secret]", "admin-password": "[secret]"}
    assert releases(result)["kube-prometheus-stack"]["values"]["grafana"]["admin"]["existingSecret"] == \
        "grafana-admin"
    assert "generated-" not in json.dumps(result.to_dict("dev"))


def test_an_existing_prometheus_gets_monitors_with_its_selector_and_nothing_installed():
    cfg = from_values("spotray", "existing", {
        "platform": "existing", "environment": "dev", "kubeconfig": "{}",
        "monitoring": {"mode": "existing", "namespace": "observability", "selectorLabels": {"prometheus": "main"}}},
        None)
    result = plan(cfg)
    assert not [r for r in result.resources if r.type == "spotray:monitoring:MonitoringStack"]
    found = {name: inputs["values"] for name, inputs in releases(result).items()}
    labels = monitor_labels(found)
    assert len(labels) == 3 and all(value == {"prometheus": "main"} for value in labels.values())
    assert found["minio"]["networkPolicy"]["ingressNSMatchLabels"] == {"kubernetes.io/metadata.name": "observability"}
    monitors = [r for r in result.resources if r.type == "kubernetes:monitoring.coreos.com/v1:PodMonitor"]
    rules = [r for r in result.resources if r.type == "kubernetes:monitoring.coreos.com/v1:PrometheusRule"]
    assert len(monitors) == 2 and len(rules) == 1
    assert all(r.inputs["metadata"]["labels"] == {"prometheus": "main"} for r in [*monitors, *rules])
    assert rules[0].inputs["metadata"]["namespace"] == "observability"
    head_policy = next(r for r in result.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy"))
    peers = [p for rule in head_policy.inputs["spec"]["ingress"] for p in rule["from"]]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}} in peers


@pytest.mark.parametrize(("monitoring", "key"), [
    ({"mode": "grafana-cloud"}, "monitoring.mode"),
    ({"release": "Kube_Prometheus"}, "monitoring.release"),
    ({"retentionDays": 0}, "monitoring.retentionDays"),
    ({"alerts": True}, "monitoring.alerts"),
    ({"alerts": {"goodputBelow": 1.5}}, "monitoring.alerts.goodputBelow"),
    ({"alerts": {"stalledMinutes": "10m"}}, "monitoring.alerts.stalledMinutes"),
])
def test_bad_monitoring_settings_name_the_key(monitoring, key):
    with pytest.raises(ConfigError) as err:
        from_values("spotray", "existing", {"platform": "existing", "environment": "dev", "monitoring": monitoring},
                    None)
    assert err.value.field == f"spotray:{key}"


def test_the_removed_gpu_hour_price_is_refused_in_one_line_naming_its_replacement():
    with pytest.raises(ConfigError) as err:
        from_values("spotray", "existing", {"platform": "existing", "environment": "dev",
                                            "monitoring": {"gpuHourPriceUsd": {"spot": 1.2, "on-demand": 4.1}}}, None)
    assert err.value.field == "spotray:monitoring.gpuHourPriceUsd"
    assert "gpuPools[].pricesUsdPerHour" in str(err.value) and "\n" not in str(err.value)
