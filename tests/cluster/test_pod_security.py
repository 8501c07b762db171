"""Every pod spotray runs (the RayJob's head, workers and submitter; the warm spares and their init container) meets
the restricted Pod Security profile, writes only to the volumes it is given, and mounts a service-account token only
where it calls the Kubernetes API (the head, which reads nodes). Every namespace spotray creates carries the Pod
Security levels the table in docs/security.md gives, and every Helm release goes into one of them."""

import re

import pytest

from cluster.pod_security import CACHE_DIR, RUN_AS_UID, SHM_SHARE
from cluster.warm_spares import warm_spares
from infra.kernel.config import GpuPoolConfig, TrainingJobConfig
from infra.kernel.names import KUBERAY_NAMESPACE, MONITORING_NAMESPACE, SYSTEM_NAMESPACE, TRAINING_NAMESPACE
from infra.kernel.namespaces import PSA_PREFIX
from infra.render import render
from tests.cluster.test_rayjob import SETTINGS, head, workers
from tests.cluster.test_rayjob import job as job  # noqa: F401 - the fixture
from tests.repo import REPO, STACKS

WRITABLE = {"/tmp", "/dev/shm", CACHE_DIR, "/local"}


def pods(job) -> dict[str, dict]:
    spare = warm_spares(GpuPoolConfig(name="a10g-spot", families=("g5",), warm_spares=1), TrainingJobConfig(),
                        SETTINGS.image, "spotray")
    return {"head": head(job)["template"]["spec"], "worker": workers(job)["template"]["spec"],
            "submitter": job["spec"]["submitterPodTemplate"]["spec"], "warm spare": spare["spec"]["template"]["spec"]}


def test_every_pod_and_container_meets_the_restricted_profile(job):
    for name, pod in pods(job).items():
        assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": RUN_AS_UID, "runAsGroup": 100,
                                          "fsGroup": 100, "seccompProfile": {"type": "RuntimeDefault"}}, name
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": True, "runAsNonRoot": True}, (name, container["name"])


@pytest.mark.parametrize("name", ["head", "worker", "submitter"])
def test_ray_pods_write_to_their_volumes_only_and_point_the_caches_there(job, name):
    pod = pods(job)[name]
    (container,) = pod["containers"]
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert {"/tmp", CACHE_DIR} <= writable <= WRITABLE
    variables = {e["name"]: e.get("value") for e in container["env"]}
    for variable in ("HF_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "MPLCONFIGDIR", "XDG_CACHE_HOME"):
        assert variables[variable].startswith(CACHE_DIR), variable
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert all(mount["name"] in volumes for mount in container["volumeMounts"])


@pytest.mark.parametrize("name", ["head", "worker"])
def test_shared_memory_is_in_memory_and_within_the_pods_limit(job, name):
    pod = pods(job)[name]
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")["emptyDir"]
    limit_gib = int(pod["containers"][0]["resources"]["limits"]["memory"].removesuffix("Gi"))
    assert shm["medium"] == "Memory"
    assert int(shm["sizeLimit"].removesuffix("Mi")) == int(limit_gib * 1024 * SHM_SHARE)


def test_only_the_head_mounts_a_service_account_token(job):
    mounted = {name for name, pod in pods(job).items() if pod.get("automountServiceAccountToken", True)}
    assert mounted == {"head"}


def test_every_namespace_spotray_creates_carries_the_levels_the_readme_gives(stack_plans):
    table = namespace_table((REPO / "docs" / "security.md").read_text())
    for stack in STACKS:
        cfg, planned = stack_plans[stack]
        rendered = render(cfg, planned)
        created = {o["metadata"]["name"]: o["metadata"]["labels"] for o in rendered.objects.values()
                   if o["kind"] == "Namespace"}
        assert set(created) == {TRAINING_NAMESPACE, KUBERAY_NAMESPACE, SYSTEM_NAMESPACE, cfg.monitoring.namespace}
        for name, labels in created.items():
            enforce, report = table[name if name != cfg.monitoring.namespace else MONITORING_NAMESPACE]
            assert labels == {f"{PSA_PREFIX}/enforce": enforce, f"{PSA_PREFIX}/warn": report,
                              f"{PSA_PREFIX}/audit": report}, (stack, name)
        releases = {release["release"]["namespace"] for release in rendered.releases.values()}
        assert releases <= set(created), f"{stack}: a release into a namespace spotray does not create"


def test_what_touches_the_host_runs_in_the_privileged_namespace_and_nothing_else_does(stack_plans):
    cfg, planned = stack_plans["dev"]
    rendered = render(cfg, planned)
    releases = {r["release"]["name"]: r for r in rendered.releases.values()}
    host = {name for name, r in releases.items() if r["release"]["namespace"] == SYSTEM_NAMESPACE}
    assert host == {"nvidia-device-plugin", "dcgm-exporter"}
    stack_values = releases["kube-prometheus-stack"]["values"]
    assert stack_values["prometheus-node-exporter"]["namespaceOverride"] == SYSTEM_NAMESPACE
    assert all(o["metadata"].get("namespace") != SYSTEM_NAMESPACE for o in rendered.objects.values())


def namespace_table(page: str) -> dict[str, tuple[str, str]]:
    """The namespace table of docs/security.md (Security): name -> (enforce, warn and audit)."""
    rows = re.findall(r"^\s*\| `([\w-]+)`[^|]*\| (\w+) \| (\w+) \|", page, re.M)
    return {name: (enforce, report) for name, enforce, report in rows}
