"""The training run as a KubeRay ``RayJob``: a pure function of the training config and the stack's job
settings, shared by the Pulumi component, ``spotray render`` and ``spotray submit``.

Shape: the head on the on-demand core pool with ``num-cpus: "0"`` (it schedules, never trains); one worker
group on a GPU spot pool, of as many pods as hold ``scaling.num_workers`` Ray Train workers (fixed size: DDP/FSDP
need them all), each pod running one worker per GPU (``worker_size.workers_per_pod``); each pod's Ray resources
equal its container's, so Ray never hands out a GPU the pod does not have. Every Ray pod
gets a local scratch ``emptyDir`` at ``LOCAL_DIR`` (``SPOTRAY_LOCAL_DIR``) for Hugging Face Trainer output dirs and
downloaded checkpoints. Every Ray pod learns its node's name from the downward API (``SPOTRAY_NODE_NAME``); the
head runs as its own service account, which may get nodes (``cluster/rbac.py``), so the driver can price them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import yaml

from cluster.charts import STORAGE_SECRET
from cluster.job_checks import check_for_cluster
from cluster.pod_security import (
    cache_env,
    container_context,
    pod_context,
    writable_mounts,
    writable_volumes,
)
from cluster.worker_size import pod_resources, worker_pods, worker_resources
from infra.kernel.config import StackConfig, TrainingJobConfig
from infra.kernel.names import (
    APP,
    APP_LABEL,
    COMPONENT_LABEL,
    CORE_SELECTOR,
    GPU_TOLERATION,
    HEAD_SERVICE_ACCOUNT,
    METRICS_PORTS,
    MINIO_CA_SECRET,
    POOL_LABEL,
    SUBMITTER_COMPONENT,
    TRAINING_COMPONENT,
    TRAINING_NAMESPACE,
    TRAINING_PRIORITY_CLASS,
    TRAINING_SERVICE_ACCOUNT,
    datasets_bucket,
    minio_endpoint,
    prometheus_url,
)
from infra.kernel.versions import RAY_VERSION
from spotray.accounts.node_records import NODE_NAME_ENV
from spotray.config import SPOT_NOTICE_S, SnapshotSection, TrainConfig
from spotray.errors import ConfigError

MAX_NAME = 47  # KubeRay derives longer names (head service, submitter job) from a RayJob's name
CONFIG_DIR = "/etc/spotray"
CONFIG_FILE = "train.yaml"
DRAIN_MARGIN_S = 20  # of the spot notice, kept for the pod to stop after Ray's drain deadline
HEAD_CPUS, HEAD_MEMORY_GIB = 2, 8  # the head schedules and serves the dashboard; it never trains
STORAGE_CA_DIR = "/etc/storage-ca"  # AWS_CA_BUNDLE: boto3 reads it, spotray hands it to pyarrow
LOCAL_DIR = "/local"  # each Ray pod's scratch emptyDir (HF Trainer output dirs, downloaded checkpoints)
LOCAL_ENV = "SPOTRAY_LOCAL_DIR"
# Its sizeLimit: a worker may fill a GPU node's root volume (the EC2NodeClass's 200 GiB); the head, on a shared core
# node, keeps to a little. Past it the kubelet evicts the pod.
WORKER_LOCAL_DISK_GIB, HEAD_LOCAL_DISK_GIB = 200, 20
PRE_RUNNING_DEADLINE_S = 1800  # give up if spot capacity never comes
_DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class JobSettings:
    """The cluster side of a training job, resolved from the stack: the image and GPU pool it runs on (and the
    pool's interruption rate, prices and warm spares, where the stack gives them), each worker's resources, secrets
    and retries (``job``), the object store it reaches, and the stack's Prometheus (which scrapes Karpenter's price
    estimates), where the stack installs one."""

    image: str
    gpu_pool: str
    pool_interruptions_per_hour: float | None = None
    pool_prices: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # {instance type: {capacity: USD/h}}
    pool_warm_spares: int = 0
    pool_gpu_limit: int | None = None
    pool_instance_types: tuple[str, ...] = ()  # what the pool may launch; empty: not the stack's say (existing)
    job: TrainingJobConfig = field(default_factory=TrainingJobConfig)
    storage_endpoint: str | None = None
    storage_secret: str | None = None  # a Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (MinIO)
    storage_ca_secret: str | None = None  # a Secret whose ca.crt signed the endpoint's certificate (MinIO)
    storage_roots: tuple[str, ...] = ()  # the s3://bucket/prefix/ URLs its pods may write; empty: not the stack's say
    prometheus_url: str | None = None


def job_settings(stack: StackConfig, image: str | None = None, gpu_pool: str | None = None) -> JobSettings:
    """The job settings of ``stack``; ``image`` and ``gpu_pool`` replace the stack's (``spotray submit``)."""
    minio = stack.storage.backend == "minio"
    name = stack.job_pool(gpu_pool)
    pool = next((p for p in stack.gpu_pools if p.name == name), None)
    monitoring = stack.monitoring
    return JobSettings(image=stack.job_image(image), gpu_pool=name,
                       pool_interruptions_per_hour=pool.interruptions_per_hour if pool else None,
                       pool_prices=dict(pool.prices_usd_per_hour) if pool else {},
                       pool_warm_spares=pool.warm_spares if pool else 0,
                       pool_gpu_limit=pool.gpu_limit if pool else None,
                       pool_instance_types=pool.instance_types if pool else (),
                       job=stack.training,
                       storage_endpoint=minio_endpoint(TRAINING_NAMESPACE) if minio else None,
                       storage_secret=STORAGE_SECRET if minio else None,
                       storage_ca_secret=MINIO_CA_SECRET if minio else None,
                       storage_roots=_storage_roots(stack),
                       prometheus_url=prometheus_url(monitoring.release, monitoring.namespace)
                       if monitoring.mode == "install" else None)


def _storage_roots(stack: StackConfig) -> tuple[str, ...]:
    """Where the stack's training credentials may write: MinIO's user and the AWS role are limited to the prefix in
    the stack's buckets; an existing cluster's own bucket is reached with whatever access it has."""
    prefix = stack.storage.prefix
    if stack.storage.backend == "minio":
        return tuple(f"s3://{bucket}/{prefix}/" for bucket in (stack.bucket, datasets_bucket(stack.bucket)))
    return (f"s3://{stack.bucket}/{prefix}/",) if stack.platform == "aws" else ()


def job_name(cfg: TrainConfig) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", cfg.run.name.lower()).strip("-")
    if not name or len(name) > MAX_NAME or not _DNS.match(name):
        raise ConfigError("run.name", f"'{cfg.run.name}' does not make a RayJob name ({len(name)} characters)",
                          f"use at most {MAX_NAME} lowercase letters, digits and '-'")
    return name


def config_map(cfg: TrainConfig, settings: JobSettings) -> dict:
    """The training config the job's entrypoint reads, mounted into the head. Every pod gets the storage
    credentials and env.forward variables from Secrets, so the driver does not copy them again. A run that sets no
    interruption rate plans for its pool's; one that sets no prices, warm spares or Prometheus bills with its
    pool's prices, counts its pool's warm spares and reads Karpenter's estimates from the stack's Prometheus."""
    check_for_cluster(cfg, settings)
    cfg = replace(cfg, env=replace(cfg.env, on_nodes=True))
    if cfg.fault_tolerance.expected_interruptions_per_hour is None:
        rate = settings.pool_interruptions_per_hour
        cfg = replace(cfg, fault_tolerance=replace(cfg.fault_tolerance, expected_interruptions_per_hour=rate))
    cost = cfg.cost
    cfg = replace(cfg, cost=replace(
        cost, prices=cost.prices or {t: dict(p) for t, p in settings.pool_prices.items()},
        warm_spares=cost.warm_spares or settings.pool_warm_spares,
        prometheus_url=cost.prometheus_url or settings.prometheus_url))
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{job_name(cfg)}-config", "namespace": TRAINING_NAMESPACE},
            "data": {CONFIG_FILE: yaml.safe_dump(cfg.to_dict(), sort_keys=True)}}


def rayjob(cfg: TrainConfig, settings: JobSettings) -> dict:
    name = job_name(cfg)
    missing = [n for n in cfg.env.forward if n not in settings.job.env_secrets]
    if missing:
        raise ConfigError("env.forward", f"{missing} have no Secret to come from on the cluster",
                          "name one per variable in the stack's training.envSecrets")
    env = _env(settings)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": TRAINING_NAMESPACE, "labels": _labels(name)},
        "spec": {
            "entrypoint": f"spotray train --config {CONFIG_DIR}/{CONFIG_FILE}",
            "submissionMode": "K8sJobMode",
            "backoffLimit": settings.job.backoff_limit,
            "preRunningDeadlineSeconds": PRE_RUNNING_DEADLINE_S,
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
                "workerGroupSpecs": [_workers(name, worker_pods(cfg, settings.job), cfg.snapshot, settings, env)],
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
            "serviceAccountName": TRAINING_SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,  # it talks to the head's dashboard, not to Kubernetes
            "securityContext": pod_context(),
            "nodeSelector": CORE_SELECTOR,
            "containers": [{"name": "ray-job-submitter", "image": settings.image, "env": cache_env(),
                            "securityContext": container_context(),
                            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"},
                                          "limits": {"cpu": "1", "memory": "1Gi"}},
                            "volumeMounts": writable_mounts(ray=False)}],
            "volumes": writable_volumes(None),
        },
    }


def _env(settings: JobSettings) -> list[dict]:
    env = [{"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    if settings.storage_endpoint:
        env.append({"name": "AWS_ENDPOINT_URL_S3", "value": settings.storage_endpoint})
    if settings.storage_secret:
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": settings.storage_secret, "key": key}}}
                for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")]
    if settings.storage_ca_secret:
        env.append({"name": "AWS_CA_BUNDLE", "value": f"{STORAGE_CA_DIR}/ca.crt"})
    env += [{"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": var}}}
            for var, secret in sorted(settings.job.env_secrets.items())]
    return env


def _local_volume(disk_gib: int) -> dict:
    return {"name": "local", "emptyDir": {"sizeLimit": f"{disk_gib}Gi"}}


def _local_mount() -> dict:
    return {"name": "local", "mountPath": LOCAL_DIR}


def _local_var() -> dict:
    return {"name": LOCAL_ENV, "value": LOCAL_DIR}


def _storage_ca_volumes(settings: JobSettings) -> list[dict]:
    if not settings.storage_ca_secret:
        return []
    return [{"name": "storage-ca", "secret": {"secretName": settings.storage_ca_secret,
                                              "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]


def _storage_ca_mounts(settings: JobSettings) -> list[dict]:
    return [{"name": "storage-ca", "mountPath": STORAGE_CA_DIR, "readOnly": True}] if settings.storage_ca_secret else []


def _head(name: str, settings: JobSettings, env: list[dict]) -> dict:
    return {
        "serviceType": "ClusterIP",  # 6379, 8265 and 10001 stay inside the cluster
        "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
        "template": {
            "metadata": {"labels": _labels(name)},
            "spec": {
                "serviceAccountName": HEAD_SERVICE_ACCOUNT,  # the only Ray pod that may get nodes (its token)
                "securityContext": pod_context(),
                "nodeSelector": CORE_SELECTOR,
                "containers": [{
                    "name": "ray-head", "image": settings.image, "env": [*env, _local_var(), *cache_env()],
                    "securityContext": container_context(),
                    "resources": pod_resources(HEAD_CPUS, HEAD_MEMORY_GIB),
                    "ports": [{"name": "gcs", "containerPort": 6379}, {"name": "dashboard", "containerPort": 8265},
                              {"name": "client", "containerPort": 10001}, *METRICS_PORTS["head"]],
                    "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}, _local_mount(),
                                     *writable_mounts(ray=True), *_storage_ca_mounts(settings)],
                }],
                "volumes": [{"name": "config", "configMap": {"name": f"{name}-config"}},
                            _local_volume(HEAD_LOCAL_DISK_GIB), *writable_volumes(HEAD_MEMORY_GIB),
                            *_storage_ca_volumes(settings)],
            },
        },
    }


def _workers(name: str, replicas: int, snapshot: SnapshotSection, settings: JobSettings, env: list[dict]) -> dict:
    job = settings.job
    return {
        "groupName": "gpu",
        "replicas": replicas, "minReplicas": replicas, "maxReplicas": replicas,
        "rayStartParams": {"num-gpus": str(job.gpus_per_worker), "num-cpus": str(job.cpus_per_worker),
                           "memory": str(job.memory_gib_per_worker << 30)},
        "template": {
            "metadata": {"labels": _labels(name), "annotations": {"karpenter.sh/do-not-disrupt": "true"}},
            "spec": {
                "serviceAccountName": TRAINING_SERVICE_ACCOUNT,  # S3 through Pod Identity: no token needed
                "automountServiceAccountToken": False,
                "securityContext": pod_context(),
                "priorityClassName": TRAINING_PRIORITY_CLASS,  # above the pool's warm spares
                "nodeSelector": {POOL_LABEL: settings.gpu_pool},
                "tolerations": [GPU_TOLERATION],
                # The spot notice covers Ray's drain (the emergency checkpoint) plus the pod's own exit.
                "terminationGracePeriodSeconds": SPOT_NOTICE_S,
                "containers": [{
                    "name": "ray-worker", "image": settings.image,
                    "env": [*env, _local_var(), *cache_env(), {"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S",
                                                               "value": str(SPOT_NOTICE_S - DRAIN_MARGIN_S)}],
                    "securityContext": container_context(),
                    "resources": worker_resources(job, snapshot),
                    "ports": METRICS_PORTS["worker"],
                    "volumeMounts": [_local_mount(), *writable_mounts(ray=True), *_storage_ca_mounts(settings)],
                }],
                "volumes": [_local_volume(WORKER_LOCAL_DISK_GIB), *writable_volumes(job.memory_gib_per_worker),
                            *_storage_ca_volumes(settings)],
            },
        },
    }
