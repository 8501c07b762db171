"""Warm spare GPU capacity, as data. A pool with ``warmSpares: N`` keeps N of its nodes up under placeholder pods:
each requests exactly one training worker's GPUs, CPUs and memory, on the pool's label and taint, at a negative
priority, and pulls the training image so that the node has it cached. A training worker (``spotray-training``
priority) that needs a node evicts a placeholder at once and starts where the image already is; Karpenter then
launches a node for the evicted placeholder in the background. The cost: N idle GPU nodes at the spot price."""

from __future__ import annotations

import pulumi

from cluster.pod_security import container_context, pod_context
from cluster.worker_size import check_worker_fits, snapshot_gib, worker_resources
from infra.kernel.config import GpuPoolConfig, TrainingJobConfig
from infra.kernel.names import (
    APP,
    APP_LABEL,
    COMPONENT_LABEL,
    GPU_TOLERATION,
    POOL_LABEL,
    TRAINING_PRIORITY_CLASS,
    WARM_SPARE_COMPONENT,
    WARM_SPARE_PRIORITY_CLASS,
)
from infra.kernel.resources import from_manifest
from infra.kernel.versions import PAUSE_IMAGE

TRAINING_PRIORITY = 1000
WARM_SPARE_PRIORITY = -10  # below every default (0): any pod that needs the node evicts a spare


def priority_classes() -> list[dict]:
    """Training workers above the default priority, placeholders below it and never preempting anything."""
    def priority_class(name: str, value: int, description: str, **more) -> dict:
        return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                "value": value, "globalDefault": False, "description": description, **more}

    return [priority_class(TRAINING_PRIORITY_CLASS, TRAINING_PRIORITY, "spotray training workers"),
            priority_class(WARM_SPARE_PRIORITY_CLASS, WARM_SPARE_PRIORITY,
                           "spotray warm spares: evicted by any pod that needs their node",
                           preemptionPolicy="Never")]


def warm_spares(pool: GpuPoolConfig, job: TrainingJobConfig, image: str, namespace: str) -> dict:
    """The Deployment of ``pool.warm_spares`` placeholders, each holding one worker's resources on one node (a node
    of the pool must hold them, or they would keep no node warm)."""
    snapshot = job.run.snapshot if job.run else None
    check_worker_fits(job, pool.name, pool.instance_types, snapshot_gib(snapshot), "its workers and warm spares")
    labels = {APP_LABEL: APP, COMPONENT_LABEL: WARM_SPARE_COMPONENT, POOL_LABEL: pool.name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"warm-spare-{pool.name}", "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": pool.warm_spares,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "priorityClassName": WARM_SPARE_PRIORITY_CLASS,
                    "nodeSelector": {POOL_LABEL: pool.name},
                    "tolerations": [GPU_TOLERATION],
                    "terminationGracePeriodSeconds": 0,  # nothing to save: make room at once
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": pod_context(),
                    "initContainers": [{  # pulls the image onto the node, then exits
                        "name": "cache-training-image", "image": image, "imagePullPolicy": "IfNotPresent",
                        "command": ["true"], "securityContext": container_context(),
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                                      "limits": {"cpu": "100m", "memory": "64Mi"}},
                    }],
                    "containers": [{"name": "placeholder", "image": PAUSE_IMAGE, "securityContext": container_context(),
                                    "resources": worker_resources(job, snapshot)}],
                },
            },
        },
    }


class WarmSpares(pulumi.ComponentResource):
    """The placeholders of every pool that has ``warmSpares``."""

    def __init__(self, name: str, pools: tuple[GpuPoolConfig, ...], job: TrainingJobConfig, image: str,
                 namespace: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:cluster:WarmSpares", name, None, opts)
        for pool in pools:
            from_manifest(f"{name}-{pool.name}", warm_spares(pool, job, image, namespace),
                          pulumi.ResourceOptions(parent=self))
        self.register_outputs({"pools": [pool.name for pool in pools]})
