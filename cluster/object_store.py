"""In-cluster MinIO (``storage.backend: minio``): generated root and training credentials kept in Kubernetes
Secrets (never in config, values or outputs), and the pinned Bitnami chart in distributed mode."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_random as random

from cluster.charts import (
    MINIO_ROOT_SECRET,
    MINIO_USERS_SECRET,
    STORAGE_SECRET,
    minio_user_entry,
    minio_values,
)
from infra.kernel import helm
from infra.kernel.config import MonitoringConfig, StorageConfig
from infra.kernel.names import MINIO_RELEASE, minio_endpoint
from infra.kernel.resources import generated_secret
from infra.kernel.versions import MINIO


@dataclass(frozen=True)
class ObjectStoreArgs:
    namespace: str
    bucket: str
    storage: StorageConfig  # prefix, pod count, volume size, images
    monitoring: MonitoringConfig  # the labels its ServiceMonitor needs, and who may scrape it


class MinioObjectStore(pulumi.ComponentResource):
    def __init__(self, name: str, args: ObjectStoreArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:cluster:MinioObjectStore", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)  # the namespace exists: TrainingNamespace comes first
        root_password = random.RandomPassword(f"{name}-root-password", length=32, special=False, opts=child)
        access_key = random.RandomPassword(f"{name}-training-access-key", length=20, special=False, opts=child)
        secret_key = random.RandomPassword(f"{name}-training-secret-key", length=40, special=False, opts=child)
        secrets = [
            generated_secret(f"{name}-root", MINIO_ROOT_SECRET, args.namespace,
                    {"root-user": "admin", "root-password": root_password.result}, child),
            generated_secret(f"{name}-users", MINIO_USERS_SECRET, args.namespace,
                    {"training": pulumi.Output.all(access_key.result, secret_key.result).apply(
                        lambda keys: minio_user_entry(*keys))}, child),
            generated_secret(f"{name}-training", STORAGE_SECRET, args.namespace,
                    {"AWS_ACCESS_KEY_ID": access_key.result, "AWS_SECRET_ACCESS_KEY": secret_key.result},
                    child),
        ]
        values = minio_values(args.bucket, args.namespace, args.storage, args.monitoring)
        release = helm.release(f"{name}-chart", MINIO, args.namespace, values,
                               pulumi.ResourceOptions(parent=self, depends_on=secrets), release_name=MINIO_RELEASE)
        self.endpoint = minio_endpoint(args.namespace)
        self.register_outputs({"release": release.name})

