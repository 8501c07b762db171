"""The in-cluster components under Pulumi mocks, alone and in the composed stacks."""

import json

import pulumi
import pulumi_kubernetes as k8s
import pytest

from cluster.addons import GpuPlumbing, KubeRayOperator
from cluster.object_store import MinioObjectStore, ObjectStoreArgs
from infra.kernel.config import MonitoringConfig, StorageConfig
from infra.plan import run_mocked

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
        assert plan.outputs["storageEndpoint"] == "http://minio.spotray.svc.cluster.local:9000"


def test_no_service_exposes_ray_ports_in_any_stack(stack_plans):
    for _, plan in stack_plans.values():
        assert not [r for r in plan.resources if r.type == "kubernetes:core/v1:Service"
                    and r.inputs.get("spec", {}).get("type") in ("LoadBalancer", "NodePort")]
