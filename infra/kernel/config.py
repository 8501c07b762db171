"""The stack's configuration, read once (by ``__main__.py`` or ``spotray plan``) into frozen, validated
dataclasses that are passed down; no component reads ``pulumi.Config`` itself.

Every value sits under the ``spotray:`` namespace of ``Pulumi.<stack>.yaml`` (plus ``aws:region``). A bad
value fails with a ``ConfigError`` naming the key and the fix."""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infra.kernel.names import MONITORING_NAMESPACE
from infra.kernel.versions import MINIO_IMAGES, Image
from training.errors import ConfigError, SpotrayError

NAMESPACE = "spotray"
KEYS = ("environment", "platform", "network", "kubernetes", "corePool", "gpuPools", "storage", "tags", "protect",
        "kubeconfig", "training", "monitoring")
ENVIRONMENTS = ("dev", "staging", "prod")
PLATFORMS = ("aws", "existing")
# NVIDIA GPU instance families Karpenter can launch for training (EC2 accelerated computing, x86_64).
GPU_FAMILIES = ("g4dn", "g5", "g6", "g6e", "gr6", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200")
MIN_KUBERNETES_MINOR = 30
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")


def _require(ok: bool, key: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(f"{NAMESPACE}:{key}", problem, fix)


def _section(raw: Any, key: str) -> dict:
    _require(raw is None or isinstance(raw, Mapping), key, f"must be a mapping, got {type(raw).__name__}",
             f"write it as an object, e.g. `pulumi config set --path '{NAMESPACE}:{key}.field' value`")
    return dict(raw or {})


def _no_unknown(raw: dict, known: set[str], key: str) -> None:
    unknown = sorted(set(raw) - known)
    _require(not unknown, key, f"unknown field(s) {unknown}", f"use only {sorted(known)}")


def _strings(value: Any, key: str) -> tuple[str, ...]:
    _require(isinstance(value, list | tuple) and all(isinstance(v, str) for v in value), key,
             f"must be a list of strings, got {value!r}", "write it as a YAML list")
    return tuple(value)


def _int(value: Any, key: str, minimum: int = 0) -> int:
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum, key,
             f"must be an integer >= {minimum}, got {value!r}", "set a whole number")
    return value


def _number(value: Any, key: str) -> float:
    _require(isinstance(value, int | float) and not isinstance(value, bool), key,
             f"must be a number, got {value!r}", "set a number")
    return float(value)


def _bool(value: Any, key: str) -> bool:
    _require(isinstance(value, bool), key, f"must be true or false, got {value!r}", "set true or false")
    return value


def _network(value: str, key: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(value)
    except (ValueError, TypeError):
        raise ConfigError(f"{NAMESPACE}:{key}", f"{value!r} is not an IPv4 CIDR block",
                          "write it like 10.20.0.0/16") from None


@dataclass(frozen=True)
class NetworkConfig:
    vpc_cidr: str = "10.20.0.0/16"
    availability_zones: tuple[str, ...] = ()
    nat_gateways: str = "single"  # "single" (cheap) or "perAz" (survives the loss of a zone)
    private_subnet_cidrs: tuple[str, ...] = ()
    public_subnet_cidrs: tuple[str, ...] = ()

    def __post_init__(self):
        vpc = _network(self.vpc_cidr, "network.vpcCidr")
        _require(16 <= vpc.prefixlen <= 20, "network.vpcCidr", f"/{vpc.prefixlen} is outside /16../20",
                 "EKS pods take VPC addresses: use a /16 to /20 block")
        azs = self.availability_zones
        _require(len(azs) >= 2, "network.availabilityZones", f"has {len(azs)} zone(s)",
                 "list at least 2 zones, e.g. [us-west-2a, us-west-2b]")
        _require(len(set(azs)) == len(azs), "network.availabilityZones", "lists a zone twice", "remove the duplicate")
        bad = [az for az in azs if not _AZ.match(az)]
        _require(not bad, "network.availabilityZones", f"{bad} are not zone names", "use names like us-west-2a")
        _require(self.nat_gateways in ("single", "perAz"), "network.natGateways", f"is {self.nat_gateways!r}",
                 "use single or perAz")
        private = self.private_subnet_cidrs or _carve(vpc, len(azs), public=False)
        public = self.public_subnet_cidrs or _carve(vpc, len(azs), public=True)
        object.__setattr__(self, "private_subnet_cidrs", tuple(private))
        object.__setattr__(self, "public_subnet_cidrs", tuple(public))
        for key, cidrs in (("privateSubnetCidrs", private), ("publicSubnetCidrs", public)):
            _require(len(cidrs) == len(azs), f"network.{key}", f"has {len(cidrs)} block(s) for {len(azs)} zones",
                     "give one block per availability zone, or leave it out to carve them from vpcCidr")
            for cidr in cidrs:
                _require(_network(cidr, f"network.{key}").subnet_of(vpc), f"network.{key}",
                         f"{cidr} is not inside vpcCidr {vpc}", "pick blocks inside vpcCidr")
        _no_overlap([*private, *public], "network.privateSubnetCidrs/publicSubnetCidrs")


def _carve(vpc: ipaddress.IPv4Network, zones: int, public: bool) -> list[str]:
    """Private subnets: the first eighths of the VPC (room for pod IPs); public: small blocks in the last."""
    eighths = list(vpc.subnets(new_prefix=vpc.prefixlen + 3))
    if not public:
        return [str(block) for block in eighths[:zones]]
    return [str(block) for block in list(eighths[-1].subnets(new_prefix=eighths[-1].prefixlen + 3))[:zones]]


def _no_overlap(cidrs: list[str], key: str) -> None:
    nets = [ipaddress.IPv4Network(c) for c in cidrs]
    for i, a in enumerate(nets):
        for b in nets[i + 1:]:
            _require(not a.overlaps(b), key, f"{a} overlaps {b}", "give every block its own address range")


@dataclass(frozen=True)
class KubernetesConfig:
    version: str = "1.33"
    service_cidr: str = "172.20.0.0/16"
    admin_principals: tuple[str, ...] = ()  # IAM role/user ARNs given cluster-admin through access entries
    public_endpoint: bool = True
    public_access_cidrs: tuple[str, ...] = ()

    def __post_init__(self):
        match = re.fullmatch(r"1\.(\d+)", str(self.version))
        _require(bool(match) and int(match.group(1)) >= MIN_KUBERNETES_MINOR, "kubernetes.version",
                 f"{self.version!r} is not a supported EKS version", f"use 1.{MIN_KUBERNETES_MINOR} or newer, quoted")
        _network(self.service_cidr, "kubernetes.serviceCidr")
        bad = [a for a in self.admin_principals if not a.startswith("arn:aws:iam::")]
        _require(not bad, "kubernetes.adminPrincipals", f"{bad} are not IAM ARNs",
                 "use role or user ARNs like arn:aws:iam::123456789012:role/platform-admin")
        for cidr in self.public_access_cidrs:
            _network(cidr, "kubernetes.publicAccessCidrs")
        _require(not self.public_endpoint or bool(self.public_access_cidrs), "kubernetes.publicAccessCidrs",
                 "is empty while publicEndpoint is true", "list the CIDRs allowed to reach the API server "
                 "(your office or VPN), or set publicEndpoint: false")
        _require("0.0.0.0/0" not in self.public_access_cidrs, "kubernetes.publicAccessCidrs",
                 "opens the API server to the whole internet", "list your office or VPN CIDRs instead")


@dataclass(frozen=True)
class CorePoolConfig:
    """On-demand managed node group for system pods, the Ray head, MinIO and monitoring."""

    instance_types: tuple[str, ...] = ("m7i.xlarge",)
    min_size: int = 2
    desired_size: int = 2
    max_size: int = 4
    disk_gib: int = 100

    def __post_init__(self):
        _require(bool(self.instance_types), "corePool.instanceTypes", "is empty", "list e.g. [m7i.xlarge]")
        gpu = [t for t in self.instance_types if _family(t) in GPU_FAMILIES]
        _require(not gpu, "corePool.instanceTypes", f"{gpu} are GPU instances on demand",
                 "keep the core pool on CPU instances; GPUs come from gpuPools (spot)")
        _require(1 <= self.min_size <= self.desired_size <= self.max_size, "corePool",
                 f"needs 1 <= minSize <= desiredSize <= maxSize, got {self.min_size}, {self.desired_size}, "
                 f"{self.max_size}", "fix the sizes")
        _require(self.disk_gib >= 20, "corePool.diskGiB", f"is {self.disk_gib}", "use at least 20")


def _family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


@dataclass(frozen=True)
class GpuPoolConfig:
    """One Karpenter NodePool of GPU nodes: spot, tainted ``nvidia.com/gpu``, optionally falling back to
    on-demand when spot capacity is gone."""

    name: str
    families: tuple[str, ...]
    sizes: tuple[str, ...] = ()  # e.g. (xlarge, 12xlarge); empty: any size of the families
    gpu_limit: int = 8  # the most GPUs this pool may run at once
    on_demand_fallback: bool = False
    labels: dict[str, str] = field(default_factory=dict)


def _gpu_pool(raw: Any, index: int) -> GpuPoolConfig:
    key = f"gpuPools[{index}]"
    raw = _section(raw, key)
    _no_unknown(raw, {"name", "families", "sizes", "gpuLimit", "onDemandFallback", "labels"}, key)
    name = raw.get("name")
    _require(isinstance(name, str) and bool(_DNS_LABEL.match(name)) and len(name) <= 40, f"{key}.name",
             f"{name!r} is not a lowercase DNS label of at most 40 characters", "use e.g. a10g-spot")
    families = _strings(raw.get("families", []), f"{key}.families")
    _require(bool(families), f"{key}.families", "is empty: a spot pool needs instance types to choose from",
             f"list GPU families, e.g. [g5, g6]; known: {', '.join(GPU_FAMILIES)}")
    unknown = [f for f in families if f not in GPU_FAMILIES]
    _require(not unknown, f"{key}.families", f"{unknown} are not GPU instance families",
             f"use some of {', '.join(GPU_FAMILIES)}")
    labels = _section(raw.get("labels"), f"{key}.labels")
    bad = [k for k in labels if k.startswith(("karpenter.sh/", "karpenter.k8s.aws/", "kubernetes.io/"))]
    _require(not bad, f"{key}.labels", f"{bad} are reserved label keys", "use your own prefix, e.g. team/...")
    return GpuPoolConfig(
        name=name, families=families, sizes=_strings(raw.get("sizes", []), f"{key}.sizes"),
        gpu_limit=_int(raw.get("gpuLimit", 8), f"{key}.gpuLimit", minimum=1),
        on_demand_fallback=_bool(raw.get("onDemandFallback", False), f"{key}.onDemandFallback"),
        labels={str(k): str(v) for k, v in labels.items()},
    )


@dataclass(frozen=True)
class StorageConfig:
    """Where datasets and checkpoints live: in-cluster MinIO, or an S3 bucket."""

    backend: str = "minio"
    bucket: str | None = None  # s3 on aws: defaults to <project>-<stack>; on an existing cluster: required
    prefix: str = "spotray"
    checkpoint_retention_days: int = 30  # old (non-current) checkpoint object versions expire after this
    minio_replicas: int = 4
    minio_size_gib: int = 100  # each MinIO pod's volume
    minio_images: Mapping[str, Image] = field(default_factory=lambda: dict(MINIO_IMAGES))

    def __post_init__(self):
        _require(self.backend in ("minio", "s3"), "storage.backend", f"is {self.backend!r}", "use minio or s3")
        _require(self.bucket is None or bool(re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", self.bucket)),
                 "storage.bucket", f"{self.bucket!r} is not a valid S3 bucket name",
                 "use 3-63 lowercase letters, digits, dots and hyphens")
        _require(bool(re.fullmatch(r"[a-zA-Z0-9._-]+(/[a-zA-Z0-9._-]+)*", self.prefix)), "storage.prefix",
                 f"{self.prefix!r} is not a key prefix", "use e.g. spotray or teams/ml")
        _require(self.checkpoint_retention_days >= 1, "storage.checkpointRetentionDays",
                 f"is {self.checkpoint_retention_days}", "use at least 1")
        _require(self.minio_replicas >= 4 and self.minio_replicas % 2 == 0, "storage.minioReplicas",
                 f"is {self.minio_replicas}", "distributed MinIO needs an even number of pods, at least 4")
        unknown = sorted(set(self.minio_images) - set(MINIO_IMAGES))
        _require(not unknown, "storage.minioImages", f"has unknown images {unknown}",
                 f"override any of {sorted(MINIO_IMAGES)}")


@dataclass(frozen=True)
class AlertThresholds:
    """When the training alerts fire (``spotray:monitoring.alerts``)."""

    stalled_minutes: int = 15  # no step progress
    checkpoint_minutes: int = 60  # no committed checkpoint
    goodput_below: float = 0.7  # for 30 minutes
    preemptions_per_hour: int = 5
    gpu_utilization_below: float = 20.0  # percent, for 15 minutes while a run reports

    def __post_init__(self):
        key = "monitoring.alerts"
        for name, minutes in (("stalledMinutes", self.stalled_minutes), ("checkpointMinutes", self.checkpoint_minutes),
                              ("preemptionsPerHour", self.preemptions_per_hour)):
            _require(minutes >= 1, f"{key}.{name}", f"is {minutes}", "use at least 1")
        _require(0 < self.goodput_below < 1, f"{key}.goodputBelow", f"is {self.goodput_below}",
                 "use a fraction between 0 and 1, e.g. 0.7")
        _require(0 < self.gpu_utilization_below <= 100, f"{key}.gpuUtilizationBelow",
                 f"is {self.gpu_utilization_below}", "use a percentage, e.g. 20")


CAPACITY_TYPES = ("spot", "on-demand")


@dataclass(frozen=True)
class MonitoringConfig:
    """``install``: kube-prometheus-stack in the stack; ``existing``: monitors for a Prometheus already there,
    which selects them by ``monitor_labels``."""

    mode: str = "install"
    release: str = "kube-prometheus-stack"  # the Helm release name; its ``release`` label selects monitors
    namespace: str = MONITORING_NAMESPACE
    retention_days: int = 15
    storage_gib: int = 50
    selector_labels: Mapping[str, str] = field(default_factory=dict)
    alerts: AlertThresholds = field(default_factory=AlertThresholds)
    # USD per GPU-hour by Karpenter capacity type; the training dashboard shows the GPU pools' cost rate if set.
    gpu_hour_price_usd: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self):
        for capacity, price in self.gpu_hour_price_usd.items():
            _require(capacity in CAPACITY_TYPES, "monitoring.gpuHourPriceUsd", f"has {capacity!r}",
                     f"key prices by capacity type: {', '.join(CAPACITY_TYPES)}")
            _require(_number(price, f"monitoring.gpuHourPriceUsd.{capacity}") > 0,
                     f"monitoring.gpuHourPriceUsd.{capacity}", f"is {price!r}", "use a positive number of USD")
        _require(self.mode in ("install", "existing"), "monitoring.mode", f"is {self.mode!r}",
                 "use install (kube-prometheus-stack) or existing (a Prometheus already on the cluster)")
        _require(bool(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,51}[a-z0-9])?", self.release)), "monitoring.release",
                 f"{self.release!r} is not a Helm release name", "use at most 53 lowercase letters, digits and '-'")
        _require(self.retention_days >= 1, "monitoring.retentionDays", f"is {self.retention_days}", "use at least 1")
        _require(self.storage_gib >= 1, "monitoring.storageGiB", f"is {self.storage_gib}", "use at least 1")

    @property
    def monitor_labels(self) -> dict[str, str]:
        """What every ServiceMonitor and PodMonitor carries: ``selector_labels``, or else the chart's convention,
        the release's name under ``release``."""
        return dict(self.selector_labels) or {"release": self.release}


def _monitoring_config(raw: dict) -> MonitoringConfig:
    _no_unknown(raw, {"mode", "release", "namespace", "retentionDays", "storageGiB", "selectorLabels", "alerts",
                      "gpuHourPriceUsd"}, "monitoring")
    d = MonitoringConfig
    return MonitoringConfig(
        mode=raw.get("mode", d.mode),
        release=raw.get("release", d.release), namespace=raw.get("namespace", d.namespace),
        retention_days=_int(raw.get("retentionDays", d.retention_days), "monitoring.retentionDays"),
        storage_gib=_int(raw.get("storageGiB", d.storage_gib), "monitoring.storageGiB"),
        selector_labels={str(k): str(v) for k, v in _section(raw.get("selectorLabels"), "monitoring.selectorLabels")
                         .items()},
        alerts=_alert_thresholds(_section(raw.get("alerts"), "monitoring.alerts")),
        gpu_hour_price_usd=_section(raw.get("gpuHourPriceUsd"), "monitoring.gpuHourPriceUsd"),
    )


def _alert_thresholds(raw: dict) -> AlertThresholds:
    key, d = "monitoring.alerts", AlertThresholds
    _no_unknown(raw, {"stalledMinutes", "checkpointMinutes", "goodputBelow", "preemptionsPerHour",
                      "gpuUtilizationBelow"}, key)
    return AlertThresholds(
        stalled_minutes=_int(raw.get("stalledMinutes", d.stalled_minutes), f"{key}.stalledMinutes", minimum=1),
        checkpoint_minutes=_int(raw.get("checkpointMinutes", d.checkpoint_minutes), f"{key}.checkpointMinutes",
                                minimum=1),
        goodput_below=_number(raw.get("goodputBelow", d.goodput_below), f"{key}.goodputBelow"),
        preemptions_per_hour=_int(raw.get("preemptionsPerHour", d.preemptions_per_hour), f"{key}.preemptionsPerHour",
                                  minimum=1),
        gpu_utilization_below=_number(raw.get("gpuUtilizationBelow", d.gpu_utilization_below),
                                      f"{key}.gpuUtilizationBelow"),
    )


@dataclass(frozen=True)
class TrainingConfig:
    """The training RayJob ``pulumi up`` deploys when ``enabled``: its run config (a file of the project) and the
    cluster resources of each worker."""

    enabled: bool = False
    config: Any = None  # the loaded training.config.TrainConfig
    image: str = ""
    gpu_pool: str = ""
    gpus_per_worker: int = 1
    cpus_per_worker: int = 8
    memory_gib_per_worker: int = 32
    env_secrets: dict[str, str] = field(default_factory=dict)
    backoff_limit: int = 3


def _training(raw: dict, project_dir: Path | None, pools: tuple[GpuPoolConfig, ...]) -> TrainingConfig:
    _no_unknown(raw, {"enabled", "config", "image", "gpuPool", "gpusPerWorker", "cpusPerWorker",
                      "memoryGiBPerWorker", "envSecrets", "backoffLimit"}, "training")
    enabled = _bool(raw.get("enabled", False), "training.enabled")
    if not enabled:
        return TrainingConfig()
    from training.config import load

    path = raw.get("config")
    _require(isinstance(path, str) and bool(path), "training.config", "is required when training is enabled",
             "name the training YAML, relative to the project directory")
    image = raw.get("image")
    _require(isinstance(image, str) and ":" in image.rsplit("/", 1)[-1], "training.image", f"is {image!r}",
             "use the image built from training/Dockerfile with an explicit tag, e.g. <ecrUrl>:<git sha>")
    pool = raw.get("gpuPool", pools[0].name if pools else "")
    _require(not pools or pool in {p.name for p in pools}, "training.gpuPool", f"{pool!r} is not a GPU pool",
             f"use one of {[p.name for p in pools]}")
    _require(bool(pool), "training.gpuPool", "is required on an existing cluster",
             "give the value of the spotray.dev/pool label of its GPU nodes")
    train = load(str((project_dir or Path.cwd()) / path))
    env_secrets = _section(raw.get("envSecrets"), "training.envSecrets")
    return TrainingConfig(
        enabled=True, config=train, image=image, gpu_pool=pool,
        gpus_per_worker=_int(raw.get("gpusPerWorker", 1), "training.gpusPerWorker", minimum=1),
        cpus_per_worker=_int(raw.get("cpusPerWorker", 8), "training.cpusPerWorker", minimum=1),
        memory_gib_per_worker=_int(raw.get("memoryGiBPerWorker", 32), "training.memoryGiBPerWorker", minimum=1),
        env_secrets={str(k): str(v) for k, v in env_secrets.items()},
        backoff_limit=_int(raw.get("backoffLimit", 3), "training.backoffLimit", minimum=2),
    )


@dataclass(frozen=True)
class StackConfig:
    project: str
    stack: str
    environment: str
    platform: str = "aws"  # "aws": build VPC + EKS; "existing": deploy the in-cluster layers to a given cluster
    region: str | None = None
    network: NetworkConfig | None = None
    kubernetes: KubernetesConfig | None = None
    core_pool: CorePoolConfig | None = None
    gpu_pools: tuple[GpuPoolConfig, ...] = ()
    storage: StorageConfig = field(default_factory=StorageConfig)
    tags: dict[str, str] = field(default_factory=dict)
    protect: bool = False  # deletion protection and retain-on-delete for stateful resources
    kubeconfig: Any = None  # existing platform: a kubeconfig (a secret Output, or str); else $KUBECONFIG
    training: TrainingConfig = field(default_factory=TrainingConfig)
    monitoring: MonitoringConfig = field(default_factory=MonitoringConfig)

    def __post_init__(self):
        _require(self.environment in ENVIRONMENTS, "environment", f"is {self.environment!r}",
                 f"use one of {', '.join(ENVIRONMENTS)}")
        _require(self.platform in PLATFORMS, "platform", f"is {self.platform!r}", f"use one of {', '.join(PLATFORMS)}")
        _require(self.environment != "prod" or self.protect, "protect", "is false in a prod stack",
                 "set spotray:protect: true (deletion protection, retain on delete)")
        names = [p.name for p in self.gpu_pools]
        _require(len(set(names)) == len(names), "gpuPools", f"names repeat: {names}", "give each pool its own name")
        if self.platform == "aws":
            _require(bool(self.region), "aws:region", "is not set", "pulumi config set aws:region us-west-2")
            wrong = [az for az in self.network.availability_zones if not az.startswith(self.region)]
            _require(not wrong, "network.availabilityZones", f"{wrong} are not in region {self.region}",
                     f"use zones of {self.region}")
            _no_overlap([self.network.vpc_cidr, self.kubernetes.service_cidr], "kubernetes.serviceCidr")
        else:
            _require(self.storage.backend == "minio" or bool(self.storage.bucket), "storage.bucket",
                     "is required for s3 on an existing cluster", "name the existing bucket the cluster can reach")
        reserved = [k for k in self.tags if k.startswith(("aws:", f"{NAMESPACE}:"))]
        _require(not reserved, "tags", f"{reserved} use a reserved prefix", "drop the aws: / spotray: prefix")

    def resource_tags(self) -> dict[str, str]:
        """Tags every AWS resource carries (the policy pack checks project and stack)."""
        return {**self.tags, f"{NAMESPACE}:project": self.project, f"{NAMESPACE}:stack": self.stack,
                f"{NAMESPACE}:environment": self.environment}

    @property
    def cluster_name(self) -> str:
        return f"{self.project}-{self.stack}"

    @property
    def bucket(self) -> str:
        return self.storage.bucket or f"{self.project}-{self.stack}"


_AWS_ONLY = ("network", "kubernetes", "corePool", "gpuPools")


def from_values(project: str, stack: str, values: Mapping[str, Any], region: str | None,
                project_dir: Path | None = None) -> StackConfig:
    """``values``: the ``spotray:`` keys without their namespace, as Pulumi or the stack file gives them;
    ``project_dir``: where paths in them are relative to (default: the working directory, as under Pulumi)."""
    unknown = sorted(set(values) - set(KEYS))
    _require(not unknown, unknown[0] if unknown else "", "is not a spotray setting", f"use only {', '.join(KEYS)}")
    platform = values.get("platform", "aws")
    environment = values.get("environment", stack)
    if platform == "existing":
        given = [k for k in _AWS_ONLY if values.get(k)]
        _require(not given, given[0] if given else "", "is not used on platform existing (no AWS resources)",
                 "remove it from the stack file")
        aws_sections = {}
    else:
        aws_sections = {
            "network": _network_config(_section(values.get("network"), "network"), environment),
            "kubernetes": _kubernetes_config(_section(values.get("kubernetes"), "kubernetes")),
            "core_pool": _core_pool_config(_section(values.get("corePool"), "corePool")),
            "gpu_pools": tuple(_gpu_pool(p, i) for i, p in enumerate(_list(values.get("gpuPools"), "gpuPools"))),
        }
    return StackConfig(
        project=project, stack=stack, environment=environment, platform=platform, region=region,
        storage=_storage_config(_section(values.get("storage"), "storage")),
        tags={str(k): str(v) for k, v in _section(values.get("tags"), "tags").items()},
        protect=_bool(values.get("protect", False), "protect"),
        kubeconfig=values.get("kubeconfig"),
        training=_training(_section(values.get("training"), "training"), project_dir,
                           aws_sections.get("gpu_pools", ())),
        monitoring=_monitoring_config(_section(values.get("monitoring"), "monitoring")),
        **aws_sections,
    )


def _list(value: Any, key: str) -> list:
    _require(value is None or isinstance(value, list), key, f"must be a list, got {type(value).__name__}",
             "write it as a YAML list of objects")
    return value or []


def _network_config(raw: dict, environment: str) -> NetworkConfig:
    _no_unknown(raw, {"vpcCidr", "availabilityZones", "natGateways", "privateSubnetCidrs", "publicSubnetCidrs"},
                "network")
    return NetworkConfig(
        vpc_cidr=raw.get("vpcCidr", NetworkConfig.vpc_cidr),
        availability_zones=_strings(raw.get("availabilityZones", []), "network.availabilityZones"),
        nat_gateways=raw.get("natGateways", "perAz" if environment == "prod" else "single"),
        private_subnet_cidrs=_strings(raw.get("privateSubnetCidrs", []), "network.privateSubnetCidrs"),
        public_subnet_cidrs=_strings(raw.get("publicSubnetCidrs", []), "network.publicSubnetCidrs"),
    )


def _kubernetes_config(raw: dict) -> KubernetesConfig:
    _no_unknown(raw, {"version", "serviceCidr", "adminPrincipals", "publicEndpoint", "publicAccessCidrs"},
                "kubernetes")
    return KubernetesConfig(
        version=str(raw.get("version", KubernetesConfig.version)),
        service_cidr=raw.get("serviceCidr", KubernetesConfig.service_cidr),
        admin_principals=_strings(raw.get("adminPrincipals", []), "kubernetes.adminPrincipals"),
        public_endpoint=_bool(raw.get("publicEndpoint", True), "kubernetes.publicEndpoint"),
        public_access_cidrs=_strings(raw.get("publicAccessCidrs", []), "kubernetes.publicAccessCidrs"),
    )


def _core_pool_config(raw: dict) -> CorePoolConfig:
    _no_unknown(raw, {"instanceTypes", "minSize", "desiredSize", "maxSize", "diskGiB"}, "corePool")
    d = CorePoolConfig
    return CorePoolConfig(
        instance_types=_strings(raw.get("instanceTypes", list(d.instance_types)), "corePool.instanceTypes"),
        min_size=_int(raw.get("minSize", d.min_size), "corePool.minSize"),
        desired_size=_int(raw.get("desiredSize", d.desired_size), "corePool.desiredSize"),
        max_size=_int(raw.get("maxSize", d.max_size), "corePool.maxSize"),
        disk_gib=_int(raw.get("diskGiB", d.disk_gib), "corePool.diskGiB"),
    )


def _storage_config(raw: dict) -> StorageConfig:
    _no_unknown(raw, {"backend", "bucket", "prefix", "checkpointRetentionDays", "minioReplicas", "minioSizeGiB",
                      "minioImages"}, "storage")
    d = StorageConfig
    images = {name: _image(ref, f"storage.minioImages.{name}")
              for name, ref in _section(raw.get("minioImages"), "storage.minioImages").items()}
    return StorageConfig(
        backend=raw.get("backend", d.backend), bucket=raw.get("bucket"), prefix=raw.get("prefix", d.prefix),
        checkpoint_retention_days=_int(raw.get("checkpointRetentionDays", d.checkpoint_retention_days),
                                       "storage.checkpointRetentionDays", minimum=1),
        minio_replicas=_int(raw.get("minioReplicas", d.minio_replicas), "storage.minioReplicas"),
        minio_size_gib=_int(raw.get("minioSizeGiB", d.minio_size_gib), "storage.minioSizeGiB", minimum=1),
        minio_images={**MINIO_IMAGES, **images},
    )


def _image(ref: Any, key: str) -> Image:
    """``registry/repository:tag``, e.g. ``<account>.dkr.ecr.<region>.amazonaws.com/bitnamilegacy/minio:<tag>``."""
    match = re.fullmatch(r"([a-z0-9.-]+(?::[0-9]+)?)/([a-z0-9._/-]+):(\w[\w.-]{0,127})", str(ref))
    registry = match.group(1) if match else ""
    _require("." in registry or ":" in registry or registry == "localhost", key,
             f"{ref!r} is not registry/repository:tag",
             "give the full reference with its registry and tag, e.g. docker.io/bitnamilegacy/minio:<tag>")
    return Image(*match.groups())


def from_pulumi() -> StackConfig:
    """The running Pulumi program's stack config; called once, by ``__main__.py``."""
    import pulumi

    config = pulumi.Config(NAMESPACE)
    values = {key: _decoded(config.get(key)) for key in KEYS if key != "kubeconfig" and config.get(key) is not None}
    if config.get("kubeconfig") is not None:
        values["kubeconfig"] = config.require_secret("kubeconfig")
    return from_values(pulumi.get_project(), pulumi.get_stack(), values, pulumi.Config("aws").get("region"))


def _decoded(value: str) -> Any:
    """The engine passes objects, lists and booleans as JSON and strings as they are (so "1.30" stays a string)."""
    return json.loads(value) if value in ("true", "false") or value[:1] in ("{", "[") else value


def load_stack_file(project_dir: Path, stack: str) -> StackConfig:
    """``Pulumi.<stack>.yaml`` read the way Pulumi would, without the CLI (for ``spotray plan`` and tests).
    Encrypted values are not decrypted: they stand in as ``[secret]``."""
    project_file, stack_file = project_dir / "Pulumi.yaml", project_dir / f"Pulumi.{stack}.yaml"
    if not stack_file.exists():
        stacks = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in project_dir.glob("Pulumi.*.yaml"))
        raise SpotrayError(f"no stack file {stack_file}: use one of {', '.join(stacks) or '(none)'}, or run "
                           "from the project directory")
    project = yaml.safe_load(project_file.read_text())["name"]
    raw = (yaml.safe_load(stack_file.read_text()) or {}).get("config") or {}
    values, region = {}, None
    for full_key, value in raw.items():
        namespace, _, key = full_key.partition(":")
        if namespace in (NAMESPACE, project):
            values[key] = "[secret]" if isinstance(value, dict) and set(value) == {"secure"} else value
        elif full_key == "aws:region":
            region = value
    return from_values(project, stack, values, region, project_dir)
