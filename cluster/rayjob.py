"""The training run as a KubeRay ``RayJob``: a pure function of the training config and the stack's job
settings, shared by the Pulumi component, ``spotray render`` and ``spotray submit``.

Shape: the head on the on-demand core pool with ``num-cpus: "0"`` (it schedules, never trains); one worker
group on a GPU spot pool, as many workers as ``scaling.num_workers`` (fixed size: DDP/FSDP need them all);
each worker's Ray resources equal its container's, so Ray never hands out a GPU the pod does not have."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import yaml

from cluster.charts import STORAGE_SECRET
from infra.kernel.config import StackConfig
from infra.kernel.names import (
    APP,
    APP_LABEL,
    COMPONENT_LABEL,
    CORE_SELECTOR,
    GPU_TOLERATION,
    METRICS_PORTS,
    POOL_LABEL,
    SUBMITTER_COMPONENT,
    TRAINING_COMPONENT,
    TRAINING_NAMESPACE,
    TRAINING_SERVICE_ACCOUNT,
    minio_endpoint,
)
from infra.kernel.versions import RAY_VERSION
from training.config import TrainConfig
from training.errors import ConfigError

MAX_NAME = 47  # KubeRay derives longer names (head service, submitter job) from a RayJob's name
CONFIG_DIR = "/etc/spotray"
CONFIG_FILE = "train.yaml"
SPOT_NOTICE_S = 120  # EC2 gives a spot instance two minutes
DRAIN_MARGIN_S = 20  # of the notice, kept for the pod to stop after Ray's drain deadline
_DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class JobSettings:
    """The cluster side of a training job, from the stack: where it runs, with what, reading which secrets."""

    image: str
    gpu_pool: str
    namespace: str = TRAINING_NAMESPACE
    service_account: str = TRAINING_SERVICE_ACCOUNT
    gpus_per_worker: int = 1
    cpus_per_worker: int = 8
    memory_gib_per_worker: int = 32
    head_cpus: int = 2
    head_memory_gib: int = 8
    storage_endpoint: str | None = None
    storage_secret: str | None = None  # a Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (MinIO)
    env_secrets: dict[str, str] = field(default_factory=dict)  # forwarded variable -> Secret holding it
    backoff_limit: int = 3  # RayJob retries: each builds a new cluster that resumes from storage
    pre_running_deadline_s: int = 1800  # give up if spot capacity never comes
    notice_s: int = SPOT_NOTICE_S

    def __post_init__(self):
        if self.backoff_limit < 2:
            raise ConfigError("training.backoffLimit", f"is {self.backoff_limit}",
                              "use at least 2, so a lost head becomes a new cluster that resumes")
        if self.notice_s <= DRAIN_MARGIN_S:
            raise ConfigError("training.noticeSeconds", f"is {self.notice_s}", f"use more than {DRAIN_MARGIN_S}")


def job_settings(stack: StackConfig, image: str | None = None, gpu_pool: str | None = None) -> JobSettings:
    """The job settings of ``stack``: its training section, its object store, and its GPU pools."""
    job = stack.training
    image = image or job.image
    if not image:
        raise ConfigError("training.image", "is not set for this stack",
                          "pass --image <registry>/<repository>:<tag>, or set spotray:training.image")
    pool = gpu_pool or job.gpu_pool or (stack.gpu_pools[0].name if stack.gpu_pools else "")
    if not pool:
        raise ConfigError("training.gpuPool", "is not set for this stack",
                          "pass --gpu-pool, or set spotray:training.gpuPool to the spotray.dev/pool of its GPU nodes")
    pools = [p.name for p in stack.gpu_pools]
    if pools and pool not in pools:
        raise ConfigError("training.gpuPool", f"{pool!r} is not a GPU pool of stack {stack.stack}",
                          f"use one of {pools}")
    minio = stack.storage.backend == "minio"
    return JobSettings(
        image=image, gpu_pool=pool, gpus_per_worker=job.gpus_per_worker, cpus_per_worker=job.cpus_per_worker,
        memory_gib_per_worker=job.memory_gib_per_worker, env_secrets=job.env_secrets, backoff_limit=job.backoff_limit,
        storage_endpoint=minio_endpoint(TRAINING_NAMESPACE) if minio else None,
        storage_secret=STORAGE_SECRET if minio else None)


def job_name(cfg: TrainConfig) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", cfg.run.name.lower()).strip("-")
    if not name or len(name) > MAX_NAME or not _DNS.match(name):
        raise ConfigError("run.name", f"'{cfg.run.name}' does not make a RayJob name ({len(name)} characters)",
                          f"use at most {MAX_NAME} lowercase letters, digits and '-'")
    return name


def config_map(cfg: TrainConfig, settings: JobSettings) -> dict:
    """The training config the job's entrypoint reads, mounted into the head. Every pod gets the storage
    credentials and env.forward variables from Secrets, so the driver does not copy them again."""
    cfg = replace(cfg, env=replace(cfg.env, on_nodes=True))
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{job_name(cfg)}-config", "namespace": settings.namespace},
            "data": {CONFIG_FILE: yaml.safe_dump(cfg.to_dict(), sort_keys=True)}}


def rayjob(cfg: TrainConfig, settings: JobSettings) -> dict:
    name = job_name(cfg)
    missing = [n for n in cfg.env.forward if n not in settings.env_secrets]
    if missing:
        raise ConfigError("env.forward", f"{missing} have no Secret to come from on the cluster",
                          "name one per variable in the stack's training.envSecrets")
    env = _env(settings)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": _labels(name)},
        "spec": {
            "entrypoint": f"spotray train --config {CONFIG_DIR}/{CONFIG_FILE}",
            "submissionMode": "K8sJobMode",
            "backoffLimit": settings.backoff_limit,
            "preRunningDeadlineSeconds": settings.pre_running_deadline_s,
            "shutdownAfterJobFinishes": True,
            "deletionStrategy": {"deletionRules": [
                # A failed job frees its GPUs at once and keeps the head an hour for its logs.
                {"policy": "DeleteWorkers", "condition": {"jobStatus": "FAILED", "ttlSeconds": 0}},
                {"policy": "DeleteCluster", "condition": {"jobStatus": "FAILED", "ttlSeconds": 3600}},
                {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 300}},
            ]},
            "submitterPodTemplate": _submitter(name, settings),
            "rayClusterSpec": {
                "rayVersion": RAY_VERSION,
                "authOptions": {"mode": "token"},
                "enableInTreeAutoscaling": False,
                "headGroupSpec": _head(name, settings, env),
                "workerGroupSpecs": [_workers(name, cfg.scaling.num_workers, settings, env)],
            },
        },
    }


def _labels(name: str, component: str = TRAINING_COMPONENT) -> dict[str, str]:
    """Every pod of a job carries them; NetworkPolicies select on the component (``cluster/network_policy.py``)."""
    return {APP_LABEL: APP, COMPONENT_LABEL: component, "spotray.dev/run": name}


def _submitter(name: str, settings: JobSettings) -> dict:
    """KubeRay's submitter pod (it fills in the ``ray job submit`` command), labelled so that it may reach the
    head's dashboard, and kept off the GPU nodes."""
    return {
        "metadata": {"labels": _labels(name, SUBMITTER_COMPONENT)},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": settings.service_account,
            "nodeSelector": CORE_SELECTOR,
            "containers": [{"name": "ray-job-submitter", "image": settings.image,
                            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"},
                                          "limits": {"cpu": "1", "memory": "1Gi"}}}],
        },
    }


def _env(settings: JobSettings) -> list[dict]:
    env = []
    if settings.storage_endpoint:
        env.append({"name": "AWS_ENDPOINT_URL_S3", "value": settings.storage_endpoint})
    if settings.storage_secret:
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": settings.storage_secret, "key": key}}}
                for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")]
    env += [{"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": var}}}
            for var, secret in sorted(settings.env_secrets.items())]
    return env


def _resources(cpus: int, memory_gib: int, gpus: int = 0) -> dict:
    amounts = {"cpu": str(cpus), "memory": f"{memory_gib}Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _head(name: str, settings: JobSettings, env: list[dict]) -> dict:
    return {
        "serviceType": "ClusterIP",  # 6379, 8265 and 10001 stay inside the cluster
        "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
        "template": {
            "metadata": {"labels": _labels(name)},
            "spec": {
                "serviceAccountName": settings.service_account,
                "nodeSelector": CORE_SELECTOR,
                "containers": [{
                    "name": "ray-head", "image": settings.image, "env": env,
                    "resources": _resources(settings.head_cpus, settings.head_memory_gib),
                    "ports": [{"name": "gcs", "containerPort": 6379}, {"name": "dashboard", "containerPort": 8265},
                              {"name": "client", "containerPort": 10001}, *METRICS_PORTS["head"]],
                    "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
                }],
                "volumes": [{"name": "config", "configMap": {"name": f"{name}-config"}}],
            },
        },
    }


def _workers(name: str, replicas: int, settings: JobSettings, env: list[dict]) -> dict:
    drain_s = settings.notice_s - DRAIN_MARGIN_S
    return {
        "groupName": "gpu",
        "replicas": replicas, "minReplicas": replicas, "maxReplicas": replicas,
        "rayStartParams": {"num-gpus": str(settings.gpus_per_worker), "num-cpus": str(settings.cpus_per_worker),
                           "memory": str(settings.memory_gib_per_worker << 30)},
        "template": {
            "metadata": {"labels": _labels(name), "annotations": {"karpenter.sh/do-not-disrupt": "true"}},
            "spec": {
                "serviceAccountName": settings.service_account,
                "nodeSelector": {POOL_LABEL: settings.gpu_pool},
                "tolerations": [GPU_TOLERATION],
                # The spot notice covers Ray's drain (the emergency checkpoint) plus the pod's own exit.
                "terminationGracePeriodSeconds": settings.notice_s,
                "containers": [{
                    "name": "ray-worker", "image": settings.image,
                    "env": [*env, {"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": str(drain_s)}],
                    "resources": _resources(settings.cpus_per_worker, settings.memory_gib_per_worker,
                                            settings.gpus_per_worker),
                    "ports": METRICS_PORTS["worker"],
                }],
            },
        },
    }
