"""The stack's configuration, read once (by ``__main__.py`` or ``spotray plan``) into frozen, validated
dataclasses that are passed down; no component reads ``pulumi.Config`` itself.

Every value sits under the ``spotray:`` namespace of ``Pulumi.<stack>.yaml`` (plus ``aws:region``). Each field
names its key once (``setting``), ``infra/kernel/settings.py`` reads each section by those keys and the field
types, and each dataclass checks its own limits in ``__post_init__``. A bad value fails with a ``ConfigError``
naming the key and the fix."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from infra.kernel.instances import GPU_FAMILIES, family_sizes, launchable
from infra.kernel.names import GITHUB_OIDC_HOST, MONITORING_NAMESPACE, datasets_bucket
from infra.kernel.settings import NAMESPACE, STACK_TAG, Section, key_of, mapping, read, setting
from infra.kernel.versions import MINIO_IMAGES, Image
from spotray.errors import ConfigError, SpotrayError, key_text, yaml_error_text

ENVIRONMENTS = ("dev", "staging", "prod")
PLATFORMS = ("aws", "existing")
GITOPS_CONTROLLERS = ("argocd", "flux", "pulumi-operator")
MIN_KUBERNETES_MINOR = 30
_GITHUB_REPOSITORY = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")


def _network(section: Section, value: str, name: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(value)
    except (ValueError, TypeError):
        section.reject(name, f"{value!r} is not an IPv4 CIDR block", "write it like 10.20.0.0/16")


def _no_overlap(section: Section, blocks: list[tuple[str, str]]) -> None:
    """``blocks``: (field, CIDR); the later of two overlapping blocks is named."""
    nets = [(name, ipaddress.IPv4Network(cidr)) for name, cidr in blocks]
    for i, (_, a) in enumerate(nets):
        for name, b in nets[i + 1:]:
            section.require(not a.overlaps(b), name, f"{b} overlaps {a}", "give every block its own address range")


@dataclass(frozen=True)
class NetworkConfig(Section):
    vpc_cidr: str = setting("vpcCidr", "10.20.0.0/16")
    availability_zones: tuple[str, ...] = setting("availabilityZones", ())
    nat_gateways: str = setting("natGateways", "single")  # single (cheap) or perAz (survives losing a zone)
    private_subnet_cidrs: tuple[str, ...] = setting("privateSubnetCidrs", ())  # default: carved from vpcCidr
    public_subnet_cidrs: tuple[str, ...] = setting("publicSubnetCidrs", ())

    def __post_init__(self):
        vpc = _network(self, self.vpc_cidr, "vpc_cidr")
        self.require(16 <= vpc.prefixlen <= 20, "vpc_cidr", f"/{vpc.prefixlen} is outside /16../20",
                     "EKS pods take VPC addresses: use a /16 to /20 block")
        azs = self.availability_zones
        self.require(len(azs) >= 2, "availability_zones", f"has {len(azs)} zone(s)",
                     "list at least 2 zones, e.g. [us-west-2a, us-west-2b]")
        self.require(len(set(azs)) == len(azs), "availability_zones", "lists a zone twice", "remove the duplicate")
        bad = [az for az in azs if not _AZ.match(az)]
        self.require(not bad, "availability_zones", f"{bad} are not zone names", "use names like us-west-2a")
        self.require(self.nat_gateways in ("single", "perAz"), "nat_gateways", f"is {self.nat_gateways!r}",
                     "use single or perAz")
        object.__setattr__(self, "private_subnet_cidrs", self.private_subnet_cidrs or _carve(vpc, len(azs), False))
        object.__setattr__(self, "public_subnet_cidrs", self.public_subnet_cidrs or _carve(vpc, len(azs), True))
        blocks = [("private_subnet_cidrs", c) for c in self.private_subnet_cidrs] + [
            ("public_subnet_cidrs", c) for c in self.public_subnet_cidrs]
        for name in ("private_subnet_cidrs", "public_subnet_cidrs"):
            count = len(getattr(self, name))
            self.require(count == len(azs), name, f"has {count} block(s) for {len(azs)} zones",
                         "give one block per availability zone, or leave it out to carve them from vpcCidr")
        for name, cidr in blocks:
            self.require(_network(self, cidr, name).subnet_of(vpc), name, f"{cidr} is not inside vpcCidr {vpc}",
                         "pick blocks inside vpcCidr")
        _no_overlap(self, blocks)


def _carve(vpc: ipaddress.IPv4Network, zones: int, public: bool) -> tuple[str, ...]:
    """Private subnets: the first eighths of the VPC (room for pod IPs); public: small blocks in the last."""
    eighths = list(vpc.subnets(new_prefix=vpc.prefixlen + 3))
    blocks = list(eighths[-1].subnets(new_prefix=eighths[-1].prefixlen + 3)) if public else eighths
    return tuple(str(block) for block in blocks[:zones])


@dataclass(frozen=True)
class KubernetesConfig(Section):
    version: str = setting("version", "1.33")
    service_cidr: str = setting("serviceCidr", "172.20.0.0/16")
    # IAM role/user ARNs given cluster-admin through access entries
    admin_principals: tuple[str, ...] = setting("adminPrincipals", ())
    public_endpoint: bool = setting("publicEndpoint", True)
    public_access_cidrs: tuple[str, ...] = setting("publicAccessCidrs", ())

    def __post_init__(self):
        match = re.fullmatch(r"1\.(\d+)", self.version)
        self.require(match is not None and int(match.group(1)) >= MIN_KUBERNETES_MINOR, "version",
                     f"{self.version!r} is not a supported EKS version",
                     f"use 1.{MIN_KUBERNETES_MINOR} or newer, quoted")
        _network(self, self.service_cidr, "service_cidr")
        bad = [a for a in self.admin_principals if not a.startswith("arn:aws:iam::")]
        self.require(not bad, "admin_principals", f"{bad} are not IAM ARNs",
                     "use role or user ARNs like arn:aws:iam::123456789012:role/platform-admin")
        for cidr in self.public_access_cidrs:
            _network(self, cidr, "public_access_cidrs")
        self.require(not self.public_endpoint or bool(self.public_access_cidrs), "public_access_cidrs",
                     "is empty while publicEndpoint is true", "list the CIDRs allowed to reach the API server "
                     "(your office or VPN), or set publicEndpoint: false")
        self.require("0.0.0.0/0" not in self.public_access_cidrs, "public_access_cidrs",
                     "opens the API server to the whole internet", "list your office or VPN CIDRs instead")


def _prices(raw: Any, key: str) -> dict[str, dict[str, float]]:
    """The run config's rule (``spotray.config.check_prices``), so a pool's prices are valid run prices."""
    from spotray.config import check_prices

    check_prices(raw, key)
    return {instance_type: {capacity: float(price) for capacity, price in by_capacity.items()}
            for instance_type, by_capacity in raw.items()}


def _family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


@dataclass(frozen=True)
class CorePoolConfig(Section):
    """On-demand managed node group for system pods, the Ray head, MinIO and monitoring."""

    instance_types: tuple[str, ...] = setting("instanceTypes", ("m7i.xlarge",))
    min_size: int = setting("minSize", 2)
    desired_size: int = setting("desiredSize", 2)
    max_size: int = setting("maxSize", 4)
    disk_gib: int = setting("diskGiB", 100)

    def __post_init__(self):
        self.require(bool(self.instance_types), "instance_types", "is empty", "list e.g. [m7i.xlarge]")
        gpu = [t for t in self.instance_types if _family(t) in GPU_FAMILIES]
        self.require(not gpu, "instance_types", f"{gpu} are GPU instances on demand",
                     "keep the core pool on CPU instances; GPUs come from gpuPools (spot)")
        self.require(1 <= self.min_size <= self.desired_size <= self.max_size, None,
                     f"needs 1 <= minSize <= desiredSize <= maxSize, got {self.min_size}, {self.desired_size}, "
                     f"{self.max_size}", "fix the sizes")
        self.require(self.disk_gib >= 20, "disk_gib", f"is {self.disk_gib}", "use at least 20")


@dataclass(frozen=True)
class GpuPoolConfig(Section):
    """One Karpenter NodePool of GPU nodes: spot, tainted ``nvidia.com/gpu``, optionally falling back to
    on-demand when spot capacity is gone."""

    name: str = setting("name", "")
    families: tuple[str, ...] = setting("families", ())
    sizes: tuple[str, ...] = setting("sizes", ())  # e.g. (xlarge, 12xlarge); empty: any size of the families
    gpu_limit: int = setting("gpuLimit", 8)  # the most GPUs this pool may run at once
    on_demand_fallback: bool = setting("onDemandFallback", False)
    labels: Mapping[str, str] = setting("labels", factory=dict)
    warm_spares: int = setting("warmSpares", 0)  # idle nodes held by placeholders, taken at once by a worker
    # The pool's interruption history: the rate checkpoint.every_steps: auto plans for, unless the run sets its own
    interruptions_per_hour: float | None = setting("interruptionsPerHour", None)
    # USD per hour by instance type and capacity type, {g5.xlarge: {spot: 0.45, on-demand: 1.006}}: the prices a
    # run on this pool bills its nodes at, unless the run sets its own (cost.prices); before Karpenter's estimates
    prices_usd_per_hour: Mapping[str, Mapping[str, float]] = setting("pricesUsdPerHour", factory=dict,
                                                                     parse=_prices)

    def __post_init__(self):
        self.require(bool(_DNS_LABEL.match(self.name)) and len(self.name) <= 40, "name",
                     f"{self.name!r} is not a lowercase DNS label of at most 40 characters", "use e.g. a10g-spot")
        self.require(bool(self.families), "families", "is empty: a spot pool needs instance types to choose from",
                     f"list GPU families, e.g. [g5, g6]; known: {', '.join(GPU_FAMILIES)}")
        unknown = [f for f in self.families if f not in GPU_FAMILIES]
        self.require(not unknown, "families", f"{unknown} are not GPU instance families",
                     f"use some of {', '.join(GPU_FAMILIES)}")
        sizes = family_sizes(self.families)
        unknown = [s for s in self.sizes if s not in sizes]
        self.require(not unknown, "sizes", f"names {', '.join(unknown)}, which no family of "
                     f"{', '.join(self.families)} comes in: Karpenter would launch no such node",
                     f"use some of {', '.join(sizes)}")
        self.require(self.gpu_limit >= 1, "gpu_limit", f"is {self.gpu_limit}", "use at least 1")
        self.require(self.warm_spares >= 0, "warm_spares", f"is {self.warm_spares}",
                     "use 0 (no spares) or the number of idle nodes to keep ready")
        rate = self.interruptions_per_hour
        self.require(rate is None or rate > 0, "interruptions_per_hour", f"is {rate}",
                     "give the rate the pool has seen (the spotray training dashboard's Interruptions), e.g. 0.5, or "
                     "leave it out")
        bad = [k for k in self.labels if k.startswith(("karpenter.sh/", "karpenter.k8s.aws/", "kubernetes.io/"))]
        self.require(not bad, "labels", f"{bad} are reserved label keys", "use your own prefix, e.g. team/...")
        for instance_type in self.prices_usd_per_hour:
            self.require(instance_type in self.instance_types,
                         f"prices_usd_per_hour.{instance_type}", f"is not an instance type pool {self.name} launches",
                         f"price only types of its families ({', '.join(self.families)})"
                         + (f" and sizes ({', '.join(self.sizes)})" if self.sizes else ""))

    @property
    def instance_types(self) -> tuple[str, ...]:
        """The instance types this pool may launch."""
        return launchable(self.families, self.sizes)


DIGEST = r"sha256:[0-9a-f]{64}"
_IMAGE = re.compile(rf"([a-z0-9.-]+(?::[0-9]+)?)/([a-z0-9._/-]+)(?::(\w[\w.-]{{0,127}}))?(?:@({DIGEST}))?")


def _image(ref: Any, key: str) -> Image:
    """``registry/repository:tag``, ``registry/repository@sha256:<digest>`` or both, e.g.
    ``<account>.dkr.ecr.<region>.amazonaws.com/bitnamilegacy/minio:<tag>``."""
    match = _IMAGE.fullmatch(str(ref))
    registry = match.group(1) if match else ""
    if not match or not ("." in registry or ":" in registry or registry == "localhost") or not (match[3] or match[4]):
        raise ConfigError(key, f"{ref!r} is not registry/repository:tag or registry/repository@sha256:<digest>",
                          "give the full reference with its registry and a tag or digest, e.g. "
                          "docker.io/bitnamilegacy/minio:<tag>")
    return Image(match[1], match[2], match[3] or "", match[4] or "")


def _minio_images(raw: Any, key: str) -> dict[str, Image]:
    """The images named in the stack file, in place of the pinned defaults."""
    return {**MINIO_IMAGES, **{name: _image(ref, f"{key}.{name}") for name, ref in mapping(raw, key).items()}}


@dataclass(frozen=True)
class StorageConfig(Section):
    """Where datasets and checkpoints live: in-cluster MinIO, or an S3 bucket."""

    backend: str = setting("backend", "minio")
    bucket: str | None = setting("bucket", None)  # s3 on aws: defaults to <project>-<stack>; existing: required
    prefix: str = setting("prefix", "spotray")
    checkpoint_retention_days: int = setting("checkpointRetentionDays", 30)  # old checkpoint versions expire
    minio_replicas: int = setting("minioReplicas", 4)
    minio_size_gib: int = setting("minioSizeGiB", 100)  # each MinIO pod's volume
    minio_images: Mapping[str, Image] = setting("minioImages", factory=lambda: dict(MINIO_IMAGES),
                                                parse=_minio_images)

    def __post_init__(self):
        self.require(self.backend in ("minio", "s3"), "backend", f"is {self.backend!r}", "use minio or s3")
        self.require(self.bucket is None or bool(re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", self.bucket)),
                     "bucket", f"{self.bucket!r} is not a valid S3 bucket name",
                     "use 3-63 lowercase letters, digits, dots and hyphens")
        self.require(bool(re.fullmatch(r"[a-zA-Z0-9._-]+(/[a-zA-Z0-9._-]+)*", self.prefix)), "prefix",
                     f"{self.prefix!r} is not a key prefix", "use e.g. spotray or teams/ml")
        self.require(self.checkpoint_retention_days >= 1, "checkpoint_retention_days",
                     f"is {self.checkpoint_retention_days}", "use at least 1")
        self.require(self.minio_replicas >= 4 and self.minio_replicas % 2 == 0, "minio_replicas",
                     f"is {self.minio_replicas}", "distributed MinIO needs an even number of pods, at least 4")
        self.require(self.minio_size_gib >= 1, "minio_size_gib", f"is {self.minio_size_gib}", "use at least 1")
        unknown = sorted(set(self.minio_images) - set(MINIO_IMAGES))
        self.require(not unknown, "minio_images", f"has unknown images {unknown}",
                     f"override any of {sorted(MINIO_IMAGES)}")


@dataclass(frozen=True)
class AlertThresholds(Section):
    """When the training alerts fire."""

    stalled_minutes: int = setting("stalledMinutes", 15)  # no step progress
    checkpoint_minutes: int = setting("checkpointMinutes", 60)  # no committed checkpoint
    goodput_below: float = setting("goodputBelow", 0.7)  # for 30 minutes
    preemptions_per_hour: int = setting("preemptionsPerHour", 5)
    gpu_utilization_below: float = setting("gpuUtilizationBelow", 20.0)  # percent, for 15 minutes while a run reports

    def __post_init__(self):
        for name in ("stalled_minutes", "checkpoint_minutes", "preemptions_per_hour"):
            self.require(getattr(self, name) >= 1, name, f"is {getattr(self, name)}", "use at least 1")
        self.require(0 < self.goodput_below < 1, "goodput_below", f"is {self.goodput_below}",
                     "use a fraction between 0 and 1, e.g. 0.7")
        self.require(0 < self.gpu_utilization_below <= 100, "gpu_utilization_below",
                     f"is {self.gpu_utilization_below}", "use a percentage, e.g. 20")


@dataclass(frozen=True)
class MonitoringConfig(Section):
    """``install``: kube-prometheus-stack in the stack; ``existing``: monitors for a Prometheus already there,
    which selects them by ``monitor_labels``."""

    mode: str = setting("mode", "install")
    release: str = setting("release", "kube-prometheus-stack")  # its ``release`` label selects monitors
    namespace: str = setting("namespace", MONITORING_NAMESPACE)
    retention_days: int = setting("retentionDays", 15)
    storage_gib: int = setting("storageGiB", 50)
    selector_labels: Mapping[str, str] = setting("selectorLabels", factory=dict)
    alerts: AlertThresholds = setting("alerts", factory=AlertThresholds)
    _RETIRED: ClassVar[dict[str, str]] = {
        "gpuHourPriceUsd": "give prices per instance type and capacity type in gpuPools[].pricesUsdPerHour "
                           "instead, e.g. {g5.xlarge: {spot: 0.45, on-demand: 1.006}}; the cluster dashboard's cost "
                           "rate now comes from Karpenter's own price estimates"}

    def __post_init__(self):
        self.require(self.mode in ("install", "existing"), "mode", f"is {self.mode!r}",
                     "use install (kube-prometheus-stack) or existing (a Prometheus already on the cluster)")
        self.require(bool(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,51}[a-z0-9])?", self.release)), "release",
                     f"{self.release!r} is not a Helm release name",
                     "use at most 53 lowercase letters, digits and '-'")
        self.require(self.retention_days >= 1, "retention_days", f"is {self.retention_days}", "use at least 1")
        self.require(self.storage_gib >= 1, "storage_gib", f"is {self.storage_gib}", "use at least 1")

    @property
    def monitor_labels(self) -> dict[str, str]:
        """What every ServiceMonitor and PodMonitor carries: ``selector_labels``, or else the chart's convention,
        the release's name under ``release``."""
        return dict(self.selector_labels) or {"release": self.release}


@dataclass(frozen=True)
class TrainingJobConfig(Section):
    """The training RayJob ``pulumi up`` deploys when ``enabled``: its run config (a file of the project) and what
    each worker gets on the cluster."""

    enabled: bool = setting("enabled", False)
    config: str = setting("config", "")  # the training YAML, relative to the project directory
    image: str = setting("image", "")  # built from training/Dockerfile, with an explicit tag
    gpu_pool: str = setting("gpuPool", "")  # default: the first GPU pool
    gpus_per_worker: int = setting("gpusPerWorker", 1)
    cpus_per_worker: int = setting("cpusPerWorker", 8)
    memory_gib_per_worker: int = setting("memoryGiBPerWorker", 32)
    env_secrets: Mapping[str, str] = setting("envSecrets", factory=dict)  # forwarded variable -> its Secret
    backoff_limit: int = setting("backoffLimit", 3)  # RayJob retries: each builds a new cluster that resumes
    run: Any = None  # the training.config.TrainConfig read from ``config``

    def __post_init__(self):
        for name in ("gpus_per_worker", "cpus_per_worker", "memory_gib_per_worker"):
            self.require(getattr(self, name) >= 1, name, f"is {getattr(self, name)}", "use at least 1")
        self.require(self.backoff_limit >= 2, "backoff_limit", f"is {self.backoff_limit}",
                     "use at least 2, so a lost head becomes a new cluster that resumes")
        self.require(not self.enabled or bool(self.config), "config", "is required when training is enabled",
                     "name the training YAML, relative to the project directory")


@dataclass(frozen=True)
class GitOpsConfig(Section):
    """How pipelines reach the stack (``infra/aws/github.py``): with ``roles``, GitHub's OIDC provider (or the
    account's, ``oidc_provider_arn``), a deploy role and a read-only preview role; no long-lived AWS keys.
    ``controller``: the in-cluster GitOps objects ``spotray render`` adds (``infra/gitops.py``). The Pulumi state
    lives in Pulumi Cloud (``organization``) or in ``state_backend`` (``s3://``) with ``secrets_provider``."""

    repository: str = setting("repository", "")  # owner/name on GitHub
    roles: bool = setting("roles", False)
    oidc_provider_arn: str = setting("oidcProviderArn", "")  # an account holds one provider per URL: reuse it
    controller: str = setting("controller", "")  # argocd, flux or pulumi-operator; empty: none
    organization: str = setting("organization", "")  # Pulumi Cloud organization (no state_backend)
    state_backend: str = setting("stateBackend", "")  # s3://bucket/prefix; empty: Pulumi Cloud
    secrets_provider: str = setting("secretsProvider", "")  # awskms://... with an s3:// state backend

    def __post_init__(self):
        self.require(not self.repository or bool(_GITHUB_REPOSITORY.match(self.repository)), "repository",
                     f"{self.repository!r} is not a GitHub repository", "write it as owner/name, e.g. acme/spotray")
        self.require(not (self.roles or self.controller) or bool(self.repository), "repository",
                     "is empty while roles or a controller is set",
                     "set it to the owner/name of the repository whose workflows deploy this stack")
        self.require(not self.oidc_provider_arn or self.oidc_provider_arn.startswith("arn:aws:iam::")
                     and self.oidc_provider_arn.endswith(f":oidc-provider/{GITHUB_OIDC_HOST}"),
                     "oidc_provider_arn", f"{self.oidc_provider_arn!r} is not GitHub's OIDC provider",
                     f"use arn:aws:iam::<account>:oidc-provider/{GITHUB_OIDC_HOST}, or leave it out "
                     "to create the provider")
        self.require(self.controller in ("", *GITOPS_CONTROLLERS), "controller", f"is {self.controller!r}",
                     f"use one of {', '.join(GITOPS_CONTROLLERS)}, or leave it out")
        self._check_state_backend()

    def _check_state_backend(self) -> None:
        if self.state_backend:
            self.require(self.state_backend.startswith("s3://") and len(self.state_backend) > 5, "state_backend",
                         f"{self.state_backend!r} is not an s3:// URL",
                         "write s3://<bucket>[/prefix], or leave it out for Pulumi Cloud")
            self.require(self.secrets_provider.startswith("awskms://"), "secrets_provider",
                         f"is {self.secrets_provider!r} with an s3:// state backend",
                         "set awskms://alias/<key alias>?region=<region> (the passphrase provider needs a "
                         "long-lived secret)")
            return
        self.require(not self.secrets_provider, "secrets_provider", "is set without a state_backend",
                     "leave it out: Pulumi Cloud encrypts the state's secrets")
        self.require(not (self.roles or self.controller == "pulumi-operator") or bool(self.organization),
                     "organization", "is empty while the state lives in Pulumi Cloud",
                     "set your Pulumi Cloud organization, or set state_backend: s3://<bucket> with secrets_provider")


@dataclass(frozen=True)
class StackConfig(Section):
    _PREFIX: ClassVar[str] = f"{NAMESPACE}:"

    project: str = ""
    stack: str = ""
    region: str | None = None  # aws:region
    environment: str = setting("environment", "")  # default: the stack's name
    platform: str = setting("platform", "aws")  # aws: build VPC + EKS; existing: the in-cluster layers only
    network: NetworkConfig | None = setting("network", None)
    kubernetes: KubernetesConfig | None = setting("kubernetes", None)
    core_pool: CorePoolConfig | None = setting("corePool", None)
    gpu_pools: tuple[GpuPoolConfig, ...] = setting("gpuPools", ())
    storage: StorageConfig = setting("storage", factory=StorageConfig)
    tags: Mapping[str, str] = setting("tags", factory=dict)
    protect: bool = setting("protect", False)  # deletion protection and retain-on-delete for stateful resources
    kubeconfig: Any = setting("kubeconfig", None)  # existing platform: a kubeconfig (a secret Output, or str)
    training: TrainingJobConfig = setting("training", factory=TrainingJobConfig)
    monitoring: MonitoringConfig = setting("monitoring", factory=MonitoringConfig)
    gitops: GitOpsConfig = setting("gitops", factory=GitOpsConfig)

    def __post_init__(self):
        self.require(self.environment in ENVIRONMENTS, "environment", f"is {self.environment!r}",
                     f"use one of {', '.join(ENVIRONMENTS)}")
        self.require(self.platform in PLATFORMS, "platform", f"is {self.platform!r}",
                     f"use one of {', '.join(PLATFORMS)}")
        self.require(self.environment != "prod" or self.protect, "protect", "is false in a prod stack",
                     "set spotray:protect: true (deletion protection, retain on delete)")
        self.require(not self.gitops.roles or not self.stack or self.environment == self.stack, "environment",
                     f"is {self.environment!r} in stack {self.stack!r}, but a deploy job's GitHub environment is "
                     "its stack's name", f"name the stack {self.environment!r}, or set spotray:environment: "
                     f"{self.stack} (a stack per environment: {', '.join(ENVIRONMENTS)})")
        names = [p.name for p in self.gpu_pools]
        self.require(len(set(names)) == len(names), "gpu_pools", f"names repeat: {names}",
                     "give each pool its own name")
        for index, pool in enumerate(self.gpu_pools):
            self._check_warm_spares(index, pool)
        if self.platform == "aws":
            self._check_aws()
        else:
            self.require(not self.gitops.roles, "gitops.roles", "is true on platform existing (no AWS account)",
                         "set it false: give the pipeline the existing cluster's credentials instead")
            self.require(self.storage.backend == "minio" or bool(self.storage.bucket), "storage.bucket",
                         "is required for s3 on an existing cluster", "name the existing bucket the cluster can reach")
        if self.storage.backend == "minio":
            self.require(len(datasets_bucket(self.bucket)) <= 63, "storage.bucket",
                         f"{self.bucket!r} leaves no room for {datasets_bucket(self.bucket)!r}",
                         f"use at most {63 - len(datasets_bucket(''))} characters with MinIO")
        reserved = [k for k in self.tags if k.startswith(("aws:", f"{NAMESPACE}:"))]
        self.require(not reserved, "tags", f"{reserved} use a reserved prefix", "drop the aws: / spotray: prefix")
        if self.training.enabled:
            self.job_image()
            self.job_pool()

    def _check_aws(self) -> None:
        if not self.region:
            raise ConfigError("aws:region", "is not set", "pulumi config set aws:region us-west-2")
        assert self.network is not None and self.kubernetes is not None, "from_values gives platform aws its sections"
        zones = self.network.availability_zones
        wrong = [az for az in zones if not az.startswith(self.region)]
        self.require(not wrong, "network.availability_zones", f"{wrong} are not in region {self.region}",
                     f"use zones of {self.region}")
        _no_overlap(self, [("network.vpc_cidr", self.network.vpc_cidr),
                           ("kubernetes.service_cidr", self.kubernetes.service_cidr)])

    def _check_warm_spares(self, index: int, pool: GpuPoolConfig) -> None:
        key = f"{self._PREFIX}{key_of(StackConfig, 'gpu_pools')}[{index}].{key_of(GpuPoolConfig, 'warm_spares')}"
        gpus = pool.warm_spares * self.training.gpus_per_worker
        if gpus > pool.gpu_limit:
            raise ConfigError(key, f"{pool.warm_spares} spares of {self.training.gpus_per_worker} GPU(s) each need "
                                   f"{gpus} GPUs, over pool {pool.name}'s gpuLimit {pool.gpu_limit}",
                              "lower warmSpares, or raise gpuLimit (the spares count against it)")
        if pool.warm_spares and not self.training.image:
            raise ConfigError(key, f"is {pool.warm_spares} but spotray:training.image is not set",
                              "set training.image: the spares pull it so that a worker's node already has it")

    def job_image(self, override: str | None = None) -> str:
        """The training image: ``override`` (``spotray submit --image``) or the stack's."""
        image = override or self.training.image
        self.require(bool(image), "training.image", "is not set for this stack",
                     "pass --image <registry>/<repository>:<tag>, or set spotray:training.image")
        name, _, digest = image.partition("@")
        self.require(":" in name.rsplit("/", 1)[-1] or bool(digest), "training.image", f"{image!r} has no tag",
                     "use the image built from training/Dockerfile with an explicit tag or digest, e.g. "
                     "<ecrUrl>:<git sha> or <ecrUrl>@sha256:<digest>")
        self.require(not digest or bool(re.fullmatch(DIGEST, digest)), "training.image",
                     f"{image!r} has a malformed digest", "write it as @sha256: and 64 hexadecimal digits")
        return image

    def job_pool(self, override: str | None = None) -> str:
        """The GPU pool training runs on: ``override`` (``--gpu-pool``), the stack's, or its first pool."""
        pools = [p.name for p in self.gpu_pools]
        pool = override or self.training.gpu_pool or (pools[0] if pools else "")
        self.require(bool(pool), "training.gpu_pool", "is not set for this stack",
                     "pass --gpu-pool, or set spotray:training.gpuPool to the spotray.dev/pool label of its GPU nodes")
        self.require(not pools or pool in pools, "training.gpu_pool",
                     f"{pool!r} is not a GPU pool of stack {self.stack}", f"use one of {pools}")
        return pool

    def resource_tags(self) -> dict[str, str]:
        """Tags every AWS resource carries (the policy pack checks project and stack)."""
        return {**self.tags, f"{NAMESPACE}:project": self.project, STACK_TAG: self.stack,
                f"{NAMESPACE}:environment": self.environment}

    @property
    def cluster_name(self) -> str:
        return f"{self.project}-{self.stack}"

    @property
    def bucket(self) -> str:
        return self.storage.bucket or f"{self.project}-{self.stack}"


_AWS_ONLY = ("network", "kubernetes", "core_pool", "gpu_pools")  # StackConfig fields
_AWS_KEYS = tuple(key_of(StackConfig, name) for name in _AWS_ONLY)  # and their keys in a stack file


def from_values(project: str, stack: str, values: Mapping[str, Any], region: str | None,
                project_dir: Path | None = None) -> StackConfig:
    """``values``: the ``spotray:`` keys without their namespace, as Pulumi or the stack file gives them;
    ``project_dir``: where paths in them are relative to (default: the working directory, as under Pulumi).
    An AWS section left empty in a stack file (``spotray:network:``) is null: it reads as absent, with its defaults."""
    values = {key: value for key, value in values.items() if value is not None or key not in _AWS_KEYS}
    try:
        cfg = read(StackConfig, values, "", _defaults(stack, values), project=project, stack=stack, region=region)
    except ConfigError as exc:
        raise exc.within(f"{NAMESPACE}:") from None
    if not cfg.training.enabled:
        return cfg
    return dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, run=_run_config(cfg, project_dir)))


def _defaults(stack: str, values: Mapping[str, Any]) -> dict[type, dict[str, Any]]:
    """Defaults that depend on the stack: the environment is the stack's name, prod gets a NAT gateway per zone,
    and an AWS stack reads its AWS sections even when the file leaves them out (their own defaults apply)."""
    environment = values.get(key_of(StackConfig, "environment")) or stack
    nat_gateways = "perAz" if environment == "prod" else "single"
    defaults: dict[type, dict[str, Any]] = {StackConfig: {"environment": stack},
                                            NetworkConfig: {"nat_gateways": nat_gateways}}
    if values.get(key_of(StackConfig, "platform")) == "existing":
        given = [key for key in _AWS_KEYS if values.get(key)]
        if given:
            raise ConfigError(given[0], "is not used on platform existing (no AWS resources)",
                              "remove it from the stack file")
    else:
        defaults[StackConfig].update({name: {} for name in _AWS_ONLY if name != "gpu_pools"})
    return defaults


def _run_config(cfg: StackConfig, project_dir: Path | None) -> Any:
    from spotray.config import load

    path = (project_dir or Path.cwd()) / cfg.training.config
    if not path.is_file():
        raise ConfigError(f"{NAMESPACE}:{key_of(StackConfig, 'training.config')}", f"{path} is not a file",
                          "name the training YAML, relative to the project directory")
    return load(str(path))


def from_pulumi() -> StackConfig:
    """The running Pulumi program's stack config; called once, by ``__main__.py``."""
    import pulumi

    config = pulumi.Config(NAMESPACE)
    kubeconfig = key_of(StackConfig, "kubeconfig")
    keys = [f.metadata["key"] for f in dataclasses.fields(StackConfig) if "key" in f.metadata]
    values = {key: _decoded(value) for key in keys if key != kubeconfig and (value := config.get(key)) is not None}
    if config.get(kubeconfig) is not None:
        values[kubeconfig] = config.require_secret(kubeconfig)
    return from_values(pulumi.get_project(), pulumi.get_stack(), values, pulumi.Config("aws").get("region"))


def _decoded(value: str) -> Any:
    """The engine passes objects, lists and booleans as JSON and strings as they are (so "1.30" stays a string)."""
    return json.loads(value) if value in ("true", "false") or value[:1] in ("{", "[") else value


def _stack_values(stack_file: Path) -> dict:
    """The ``config:`` mapping of a stack file, checked for the shape Pulumi reads."""
    try:
        document = yaml.safe_load(stack_file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError("config", f"{stack_file.name} is not valid YAML {yaml_error_text(exc)}",
                          "fix the file, or rewrite it with `pulumi config set`") from None
    raw = document.get("config") if isinstance(document, dict) else document
    if not isinstance(document, dict) or not isinstance(raw or {}, dict):
        raise ConfigError("config", f"{stack_file.name} must hold a mapping `config:` of keys, got "
                          f"{type(raw).__name__}", "e.g. `config:` then `  spotray:environment: dev` below it")
    for full_key in raw or {}:
        if not isinstance(full_key, str):
            raise ConfigError(key_text(full_key), "a stack config key is a namespace:name string",
                              "e.g. spotray:network")
    return raw or {}


def load_stack_file(project_dir: Path, stack: str) -> StackConfig:
    """``Pulumi.<stack>.yaml`` read the way Pulumi would, without the CLI (for ``spotray plan`` and tests).
    Encrypted values are not decrypted: they stand in as ``[secret]``."""
    project_file, stack_file = project_dir / "Pulumi.yaml", project_dir / f"Pulumi.{stack}.yaml"
    if not stack_file.exists():
        stacks = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in project_dir.glob("Pulumi.*.yaml"))
        raise SpotrayError(f"no stack file {stack_file}: use one of {', '.join(stacks) or '(none)'}, or run "
                           "from the project directory")
    project = yaml.safe_load(project_file.read_text())["name"]
    values, region = {}, None
    for full_key, value in _stack_values(stack_file).items():
        namespace, _, key = full_key.partition(":")
        if namespace in (NAMESPACE, project):
            values[key] = "[secret]" if isinstance(value, dict) and set(value) == {"secure"} else value
        elif full_key == "aws:region":
            region = value
    return from_values(project, stack, values, region, project_dir)
