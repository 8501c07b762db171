"""Every chart, image and AMI version the infrastructure pins, in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chart:
    name: str
    repo: str  # an https Helm repository, or an oci:// registry path (then ``name`` is its last segment)
    version: str


KARPENTER = Chart("karpenter", "oci://public.ecr.aws/karpenter", "1.14.1")

# EKS-optimized Amazon Linux 2023 release for Karpenter nodes; it picks the NVIDIA variant for GPU instances.
# Pinned (not @latest) so that a new AMI never drifts, and so replaces, nodes that are running training.
NODE_AMI_ALIAS = "al2023@v20251110"

RAY_VERSION = "2.60.0"
# The training image's base; the image a stack runs is its own build (training/Dockerfile) pushed to its ECR.
RAY_GPU_IMAGE = f"rayproject/ray:{RAY_VERSION}-py311-gpu"

KUBERAY_OPERATOR = Chart("kuberay-operator", "https://ray-project.github.io/kuberay-helm/", "1.7.0")
# KubeRay's CRDs, applied server-side before the chart (the rayjobs CRD is too large for client-side apply): files
# of its git repository at the chart's version.
KUBERAY_GIT = "https://github.com/ray-project/kuberay.git"
KUBERAY_CRD_DIR = "ray-operator/config/crd/bases"
KUBERAY_CRD_FILES = tuple(f"ray.io_{kind}.yaml" for kind in ("rayclusters", "rayjobs", "rayservices"))
KUBERAY_CRDS = tuple(f"https://raw.githubusercontent.com/ray-project/kuberay/v{KUBERAY_OPERATOR.version}/"
                     f"{KUBERAY_CRD_DIR}/{file}" for file in KUBERAY_CRD_FILES)
NVIDIA_DEVICE_PLUGIN = Chart("nvidia-device-plugin", "https://nvidia.github.io/k8s-device-plugin", "0.20.0")
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # the warm spares' placeholder container
MINIO = Chart("minio", "oci://registry-1.docker.io/bitnamicharts", "17.0.23")


@dataclass(frozen=True)
class Image:
    registry: str
    repository: str
    tag: str
    digest: str = ""  # sha256:<64 hex>; where set, it is what is pulled


# Bitnami's free images moved to the frozen bitnamilegacy repository in 2025: the chart's defaults no longer
# pull. These are the legacy tags of the chart's own defaults; a stack may point them at its ECR mirror.
MINIO_IMAGES = {
    "server": Image("docker.io", "bitnamilegacy/minio", "2025.7.23-debian-12-r3"),
    "client": Image("docker.io", "bitnamilegacy/minio-client", "2025.7.21-debian-12-r2"),
    "os-shell": Image("docker.io", "bitnamilegacy/os-shell", "12-debian-12-r50"),
}
KUBE_PROMETHEUS_STACK = Chart("kube-prometheus-stack", "https://prometheus-community.github.io/helm-charts",
                              "88.5.3")
DCGM_EXPORTER = Chart("dcgm-exporter", "https://nvidia.github.io/dcgm-exporter/helm-charts", "4.8.2")
