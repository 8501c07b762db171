"""Every pod spotray runs (the RayJob's head, workers and submitter; the warm spares and their init container) meets
the restricted Pod Security profile, writes only to the volumes it is given, and mounts a service-account token only
where it calls the Kubernetes API (the head, which reads nodes)."""

import pytest

from spotray.cluster.pod_security import CACHE_DIR, RUN_AS_UID, SHM_SHARE
from spotray.cluster.warm_spares import warm_spares
from spotray.infra.kernel.config import GpuPoolConfig, TrainingJobConfig
from tests.cluster.test_rayjob import SETTINGS, head, workers
from tests.cluster.test_rayjob import job as job  # noqa: F401 - the fixture

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
