"""The whole program for one stack, composed from components: what ``pulumi up`` and ``spotray plan`` run."""

from __future__ import annotations

import os

import pulumi
import pulumi_kubernetes as k8s

from cluster.addons import GpuPlumbing, KubeRayOperator, SystemNamespace
from cluster.object_store import MinioObjectStore, ObjectStoreArgs
from cluster.rayjob import job_settings
from cluster.training_job import TrainingJob, TrainingNamespace
from cluster.warm_spares import WarmSpares
from infra.aws.eks import Cluster, ClusterArgs
from infra.aws.github import GitHubRoles, GitHubRolesArgs
from infra.aws.iam import PermissionsBoundary
from infra.aws.karpenter import Karpenter, KarpenterArgs
from infra.aws.network import Network, NetworkArgs
from infra.aws.nodes import CoreNodes, CoreNodesArgs
from infra.aws.registry import ImageRepository, ImageRepositoryArgs
from infra.aws.storage import BucketArgs, CheckpointBucket
from infra.kernel.config import StackConfig
from infra.kernel.names import TRAINING_NAMESPACE, TRAINING_SERVICE_ACCOUNT, datasets_bucket, minio_endpoint
from monitoring.objects import MonitoringObjects
from monitoring.stack import MonitoringStack


def deploy(cfg: StackConfig) -> dict[str, pulumi.Input]:
    """Creates the stack's resources; returns the stack outputs."""
    if cfg.platform == "existing":
        return _existing_cluster(cfg)
    # from_values gives platform aws its sections and StackConfig refuses it without a region
    assert cfg.network and cfg.kubernetes and cfg.core_pool and cfg.region
    tags = cfg.resource_tags()
    boundary = PermissionsBoundary("boundary", cfg.cluster_name, tags).arn
    network = Network("network", NetworkArgs(cfg.network, cfg.cluster_name, tags))
    cluster = Cluster("cluster", ClusterArgs(cfg.cluster_name, cfg.kubernetes, cfg.region,
                                             [*network.private_subnet_ids, *network.public_subnet_ids], tags,
                                             cfg.protect, boundary))
    core = CoreNodes("core", CoreNodesArgs(cluster.name, cfg.core_pool, network.private_subnet_ids, tags, boundary))
    provider = k8s.Provider("eks", kubeconfig=cluster.kubeconfig,
                            opts=pulumi.ResourceOptions(depends_on=[core.ready]))
    with_monitoring = _monitoring(cfg, provider, depends_on=[core.ready, _system_namespace(provider, [core.ready])])
    karpenter = Karpenter("karpenter", KarpenterArgs(cluster.name, cluster.cluster.endpoint, cfg.region,
                                                     cfg.gpu_pools, tags, provider, depends_on=with_monitoring,
                                                     monitor_labels=cfg.monitoring.monitor_labels, boundary=boundary))
    _in_cluster(cfg, provider, depends_on=with_monitoring)
    registry = ImageRepository("registry", ImageRepositoryArgs(f"{cfg.project}/{cfg.stack}/training", tags,
                                                                    cfg.protect))
    outputs = {"clusterName": cluster.name, "kubeconfig": cluster.kubeconfig, "ecrUrl": registry.url,
               "gpuPools": karpenter.node_pools, "interruptionQueue": karpenter.queue_name}
    if cfg.storage.backend == "s3":
        bucket = CheckpointBucket("storage", BucketArgs(cfg.bucket, cfg.storage, cluster.name, tags, cfg.protect,
                                                              boundary))
        outputs.update(storageEndpoint=f"https://s3.{cfg.region}.amazonaws.com", storageBucket=bucket.bucket_name)
    else:
        outputs.update(storageEndpoint=minio_endpoint(TRAINING_NAMESPACE), storageBucket=cfg.bucket,
                       datasetsBucket=datasets_bucket(cfg.bucket))
    if cfg.gitops.roles:
        github = GitHubRoles("github", GitHubRolesArgs(cfg.gitops, cfg.environment, cfg.cluster_name, cfg.stack, tags,
                                                            boundary))
        outputs.update(deployRoleArn=github.deploy_role_arn, previewRoleArn=github.preview_role_arn)
    return outputs


def _system_namespace(provider: k8s.Provider, depends_on: list[pulumi.Resource]) -> pulumi.Resource:
    """Before monitoring: its node exporter lives there, beside the GPU plumbing."""
    return SystemNamespace("system", opts=pulumi.ResourceOptions(providers=[provider], depends_on=depends_on))


def _monitoring(cfg: StackConfig, provider: k8s.Provider, depends_on: list[pulumi.Resource]) -> list[pulumi.Resource]:
    """kube-prometheus-stack where the stack installs it; returns ``depends_on`` with it, for everything that
    brings a ServiceMonitor (Karpenter and every add-on), whose CRD comes with it."""
    if cfg.monitoring.mode != "install":
        return depends_on
    return [*depends_on, MonitoringStack("monitoring", cfg.monitoring, opts=pulumi.ResourceOptions(
        providers=[provider], depends_on=depends_on))]


def _in_cluster(cfg: StackConfig, provider: k8s.Provider, depends_on: list[pulumi.Resource]) -> None:
    """The layers every stack installs into Kubernetes once monitoring is there (``_monitoring``: the stack's, or
    monitors for the Prometheus already there): KubeRay, GPU plumbing, the training namespace, MinIO when it is the
    store, the pools' warm spares, and the training job when enabled.
    """
    monitoring = cfg.monitoring
    opts = pulumi.ResourceOptions(providers=[provider], depends_on=depends_on)
    labels = monitoring.monitor_labels
    kuberay = KubeRayOperator("kuberay", labels, opts=opts)
    GpuPlumbing("gpu", labels, opts=opts)
    namespace = TrainingNamespace("training", TRAINING_NAMESPACE, TRAINING_SERVICE_ACCOUNT, monitoring.namespace,
                                  opts=opts)
    MonitoringObjects("monitors", monitoring, TRAINING_NAMESPACE, opts=pulumi.ResourceOptions(
        providers=[provider], depends_on=[*depends_on, namespace]))
    ready = [namespace, kuberay]
    if cfg.storage.backend == "minio":
        store = ObjectStoreArgs(TRAINING_NAMESPACE, cfg.bucket, cfg.storage, monitoring)
        ready.append(MinioObjectStore("minio", store, opts=pulumi.ResourceOptions(
            providers=[provider], depends_on=[*depends_on, namespace])))
    spare_pools = tuple(pool for pool in cfg.gpu_pools if pool.warm_spares)
    if spare_pools:
        WarmSpares("warm-spares", spare_pools, cfg.training, cfg.job_image(), TRAINING_NAMESPACE,
                   opts=pulumi.ResourceOptions(providers=[provider], depends_on=[*depends_on, namespace]))
    if cfg.training.enabled:
        TrainingJob("training-job", cfg.training.run, job_settings(cfg),
                    opts=pulumi.ResourceOptions(providers=[provider], depends_on=ready))


def _existing_cluster(cfg: StackConfig) -> dict[str, pulumi.Input]:
    """No AWS at all: a provider for the given cluster, on which the in-cluster layers are deployed."""
    kubeconfig = cfg.kubeconfig or os.environ.get("KUBECONFIG")
    if not kubeconfig:
        raise pulumi.RunError("platform existing needs a kubeconfig: `pulumi config set --secret spotray:kubeconfig "
                              "\"$(cat ~/.kube/config)\"`, or export KUBECONFIG")
    provider = k8s.Provider("existing", kubeconfig=kubeconfig)
    _in_cluster(cfg, provider, depends_on=_monitoring(cfg, provider, depends_on=[_system_namespace(provider, [])]))
    minio = cfg.storage.backend == "minio"
    endpoint = minio_endpoint(TRAINING_NAMESPACE) if minio else "https://s3.amazonaws.com"
    outputs: dict[str, pulumi.Input] = {"storageEndpoint": endpoint, "storageBucket": cfg.bucket, "gpuPools": []}
    return {**outputs, "datasetsBucket": datasets_bucket(cfg.bucket)} if minio else outputs
