"""The in-cluster components under Pulumi mocks, alone and in the composed stacks."""

import json

import pulumi
import pulumi_kubernetes as k8s
import pytest

from cluster.addons import GpuPlumbing, KubeRayOperator
from cluster.object_store import MinioObjectStore, ObjectStoreArgs
from infra.kernel.config import MonitoringConfig, StorageConfig
from infra.plan import run_mocked
from tests.repo import STACKS
from tests.schemas import merged, pinned_chart_values

LABELS = {"release": "kube-prometheus-stack"}


def under_provider(build):
    def program():
        build(k8s.Provider("k", kubeconfig="{}"))
        return {}
    return run_mocked(program, "spotray", "t", None)


def releases(plan) -> dict[str, dict]:
    return {r.name: r.inputs for r in plan.of_type("kubernetes:helm.sh/v3:Release")}


def test_kuberay_crds_are_applied_before_the_chart_which_skips_its_own():
    plan = under_provider(lambda p: KubeRayOperator("kr", LABELS, opts=pulumi.ResourceOptions(providers=[p])))
    crds = plan.of_type("kubernetes:yaml/v2:ConfigFile")
    assert sorted(c.inputs["file"].rsplit("/", 1)[1] for c in crds) == [
        "ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml"]
    assert all("/v1.7.0/" in c.inputs["file"] for c in crds)
    chart = plan.named("kr-chart")
    assert set(chart.depends_on) >= {c.name for c in crds}
    assert chart.inputs["skipCrds"] is True and chart.inputs["version"] == "1.7.0"
    assert chart.inputs["values"]["nodeSelector"] == {"spotray.dev/pool": "core"}


def test_gpu_plumbing_reaches_tainted_gpu_nodes():
    plan = under_provider(lambda p: GpuPlumbing("gpu", LABELS, opts=pulumi.ResourceOptions(providers=[p])))
    for values in (r["values"] for r in releases(plan).values()):
        assert values["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert values["nodeSelector"] == {"spotray.dev/gpu": "true"}


@pytest.fixture(scope="module")
def minio():
    args = ObjectStoreArgs("spotray", "spotray-t", StorageConfig(minio_size_gib=50), MonitoringConfig())
    return under_provider(lambda p: MinioObjectStore("minio", args, opts=pulumi.ResourceOptions(providers=[p])))


def test_minio_credentials_are_generated_into_secrets_and_never_shown(minio):
    secrets = {r.inputs["metadata"]["name"]: r for r in minio.of_type("kubernetes:core/v1:Secret")}
    assert set(secrets) == {"minio-root", "minio-users", "spotray-storage"}
    assert all(set(s.inputs["stringData"].values()) == {"[secret]"} for s in secrets.values())
    assert set(secrets["spotray-storage"].inputs["stringData"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    everything = json.dumps(minio.to_dict("dev"))
    assert "generated-" not in everything  # no generated password anywhere in the plan
    chart = minio.named("minio-chart")
    assert set(chart.depends_on) >= {s.name for s in secrets.values()}
    assert chart.inputs["name"] == "minio" and chart.inputs["values"]["auth"] == {"existingSecret": "minio-root"}


@pytest.mark.parametrize("stack", ["dev", "prod", "existing"])
def test_every_stack_installs_kuberay_and_gpu_plumbing_and_minio_only_when_it_is_the_store(stack_plans, stack):
    cfg, plan = stack_plans[stack]
    components = {r.type for r in plan.resources if not r.custom}
    assert {"spotray:cluster:KubeRayOperator", "spotray:cluster:GpuPlumbing"} <= components
    assert ("spotray:cluster:MinioObjectStore" in components) == (cfg.storage.backend == "minio")
    if cfg.storage.backend == "minio":
        assert plan.outputs["storageEndpoint"] == "https://minio.spotray.svc.cluster.local:9000"


def service_types(values: dict, path: str = "") -> dict[str, str]:
    """Every ``service.type`` (or ``*Service.type``) in a chart's values: where a chart exposes a Service."""
    found = {}
    for key, value in values.items():
        if isinstance(value, dict):
            if (key == "service" or key.endswith("Service")) and isinstance(value.get("type"), str):
                found[f"{path}{key}.type"] = value["type"]
            found.update(service_types(value, f"{path}{key}."))
    return found


@pytest.mark.parametrize("stack", STACKS)
def test_no_chart_exposes_a_service_outside_the_cluster_in_any_stack(stack_plans, stack):
    """The values each release sets over its pinned chart's defaults; the RayJob's head: test_rayjob.py."""
    _, plan = stack_plans[stack]
    exposed = {}
    for release in plan.of_type("kubernetes:helm.sh/v3:Release"):
        values = merged(pinned_chart_values(release.inputs["chart"], release.inputs["version"]),
                        release.inputs["values"])
        exposed.update({f"{release.name}: {path}": kind for path, kind in service_types(values).items()
                        if kind in ("LoadBalancer", "NodePort")})
    assert exposed == {}


def test_a_chart_value_that_opens_a_load_balancer_is_found():
    values = merged(pinned_chart_values("minio", "17.0.23"), {"console": {"service": {"type": "LoadBalancer"}}})
    assert service_types(values)["console.service.type"] == "LoadBalancer"
    assert service_types(values)["service.type"] == "ClusterIP"
