import pytest

from spotray.cluster.charts import (
    dcgm_exporter_values,
    device_plugin_values,
    kuberay_operator_values,
    minio_user_entry,
    minio_values,
)
from spotray.infra.kernel.config import MonitoringConfig, StorageConfig
from spotray.infra.kernel.versions import Image
from tests.schemas import chart_defaults, unknown_values_keys

MONITOR_LABELS = {"release": "kube-prometheus-stack"}
LEGACY = minio_values("spotray-dev", StorageConfig(), MonitoringConfig())


@pytest.mark.parametrize(("values", "chart"), [
    (kuberay_operator_values(MONITOR_LABELS), "kuberay-operator-1.7.0.values.yaml"),
    (device_plugin_values(), "nvidia-device-plugin-0.20.0.values.yaml"),
    (dcgm_exporter_values(MONITOR_LABELS), "dcgm-exporter-4.8.2.values.yaml"),
    (LEGACY, "bitnami-minio-17.0.23.values.yaml"),
])
def test_every_value_set_exists_in_the_pinned_chart(values, chart):
    assert unknown_values_keys(values, chart_defaults(chart)) == []


def test_the_device_plugin_runs_only_on_gpu_nodes_and_tolerates_their_taint():
    values = device_plugin_values()
    assert values["nodeSelector"] == {"spotray.dev/gpu": "true"}
    assert values["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_minio_is_distributed_persistent_disruption_bounded_and_on_the_core_pool():
    assert LEGACY["mode"] == "distributed" and LEGACY["statefulset"]["replicaCount"] >= 4
    assert LEGACY["persistence"] == {"enabled": True, "size": "100Gi"}
    assert LEGACY["pdb"]["create"] is True and LEGACY["nodeSelector"] == {"spotray.dev/pool": "core"}
    sized = minio_values("b", StorageConfig(minio_replicas=6, minio_size_gib=10), MonitoringConfig())
    assert sized["statefulset"]["replicaCount"] == 6 and sized["persistence"]["size"] == "10Gi"


def test_minio_credentials_never_appear_in_values():
    assert LEGACY["auth"] == {"existingSecret": "minio-root"}
    assert "users" not in LEGACY["provisioning"]
    assert LEGACY["provisioning"]["usersExistingSecrets"] == ["minio-users"]
    assert "password" not in str(LEGACY).lower()


def test_legacy_images_need_and_get_the_insecure_images_switch_and_bitnami_ones_do_not():
    assert LEGACY["image"]["repository"] == "bitnamilegacy/minio"
    assert LEGACY["global"]["security"]["allowInsecureImages"] is True
    bitnami = {k: Image("docker.io", f"bitnami/{k}", "t") for k in ("server", "client", "os-shell")}
    assert "global" not in minio_values("b", StorageConfig(minio_images=bitnami), MonitoringConfig())


def test_an_image_given_by_digest_is_pulled_by_it_through_the_charts_own_digest_key():
    digest = "sha256:" + "ab" * 32
    images = {k: Image("docker.io", f"bitnamilegacy/{k}", "", digest) for k in ("server", "client", "os-shell")}
    values = minio_values("b", StorageConfig(minio_images=images), MonitoringConfig())
    assert values["image"] == {"registry": "docker.io", "repository": "bitnamilegacy/server", "tag": "",
                               "digest": digest}
    assert unknown_values_keys(values, chart_defaults("bitnami-minio-17.0.23.values.yaml")) == []


def test_checkpoints_and_datasets_get_a_bucket_each_and_only_checkpoints_are_versioned():
    assert LEGACY["provisioning"]["buckets"] == [{"name": "spotray-dev", "versioning": "Versioned"},
                                                 {"name": "spotray-dev-datasets"}]


def test_the_training_user_may_use_only_its_prefix():
    statements = LEGACY["provisioning"]["policies"][0]["statements"]
    assert statements[1]["resources"] == ["arn:aws:s3:::spotray-dev/spotray/*",
                                          "arn:aws:s3:::spotray-dev-datasets/spotray/*"]
    assert statements[0]["resources"] == ["arn:aws:s3:::spotray-dev", "arn:aws:s3:::spotray-dev-datasets"]
    assert statements[0]["condition"] == {"StringLike": {"s3:prefix": ["spotray/*"]}}
    assert "policies=spotray-training" in minio_user_entry("ak", "sk")


def test_minio_cluster_and_node_metrics_are_scraped_without_a_token():
    monitor = LEGACY["metrics"]["serviceMonitor"]
    assert monitor["enabled"] and "paths" not in monitor and "prometheusAuthType" not in LEGACY["metrics"]
    defaults = chart_defaults("bitnami-minio-17.0.23.values.yaml")["metrics"]  # what the chart then uses
    assert defaults["serviceMonitor"]["paths"] == ["/minio/v2/metrics/cluster", "/minio/v2/metrics/node"]
    assert defaults["prometheusAuthType"] == "public"
