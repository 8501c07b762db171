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
