"""The GPU instance types a spot pool may launch, by EC2's own figures, and which of them one training worker fits
on. A worker that fits none would wait for a node Karpenter never launches, with nothing said; this makes it one line
before the RayJob is applied. The figures are DescribeInstanceTypes' (``tests/infra/test_instances.py`` holds them
against that API's data as moto ships it); where AWS adds a size, add it here."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

# What a node keeps from its pods: the kubelet's reserve, the daemons (CNI, kube-proxy, the GPU device plugin,
# exporters) and the VM's own overhead (Karpenter assumes 7.5 % of the memory)
NODE_KEEPS_CPUS = 1
NODE_KEEPS_MEMORY_SHARE = 0.1


class InstanceShape(NamedTuple):
    gpus: int
    vcpus: int
    memory_gib: int

    @property
    def pod_cpus(self) -> int:
        """The most whole CPUs one pod may request on it."""
        return self.vcpus - NODE_KEEPS_CPUS

    @property
    def pod_memory_gib(self) -> int:
        """The most whole GiB of memory one pod may request on it."""
        return int(self.memory_gib * (1 - NODE_KEEPS_MEMORY_SHARE))


INSTANCE_SHAPES: dict[str, InstanceShape] = {
    "g4dn.xlarge": InstanceShape(1, 4, 16), "g4dn.2xlarge": InstanceShape(1, 8, 32),
    "g4dn.4xlarge": InstanceShape(1, 16, 64), "g4dn.8xlarge": InstanceShape(1, 32, 128),
    "g4dn.12xlarge": InstanceShape(4, 48, 192), "g4dn.16xlarge": InstanceShape(1, 64, 256),
    "g4dn.metal": InstanceShape(8, 96, 384),
    "g5.xlarge": InstanceShape(1, 4, 16), "g5.2xlarge": InstanceShape(1, 8, 32),
    "g5.4xlarge": InstanceShape(1, 16, 64), "g5.8xlarge": InstanceShape(1, 32, 128),
    "g5.12xlarge": InstanceShape(4, 48, 192), "g5.16xlarge": InstanceShape(1, 64, 256),
    "g5.24xlarge": InstanceShape(4, 96, 384), "g5.48xlarge": InstanceShape(8, 192, 768),
    "g6.xlarge": InstanceShape(1, 4, 16), "g6.2xlarge": InstanceShape(1, 8, 32),
    "g6.4xlarge": InstanceShape(1, 16, 64), "g6.8xlarge": InstanceShape(1, 32, 128),
    "g6.12xlarge": InstanceShape(4, 48, 192), "g6.16xlarge": InstanceShape(1, 64, 256),
    "g6.24xlarge": InstanceShape(4, 96, 384), "g6.48xlarge": InstanceShape(8, 192, 768),
    "g6e.xlarge": InstanceShape(1, 4, 32), "g6e.2xlarge": InstanceShape(1, 8, 64),
    "g6e.4xlarge": InstanceShape(1, 16, 128), "g6e.8xlarge": InstanceShape(1, 32, 256),
    "g6e.12xlarge": InstanceShape(4, 48, 384), "g6e.16xlarge": InstanceShape(1, 64, 512),
    "g6e.24xlarge": InstanceShape(4, 96, 768), "g6e.48xlarge": InstanceShape(8, 192, 1536),
    "gr6.4xlarge": InstanceShape(1, 16, 128), "gr6.8xlarge": InstanceShape(1, 32, 256),
    "p4d.24xlarge": InstanceShape(8, 96, 1152),
    "p4de.24xlarge": InstanceShape(8, 96, 1152),
    "p5.4xlarge": InstanceShape(1, 16, 256), "p5.48xlarge": InstanceShape(8, 192, 2048),
    "p5e.48xlarge": InstanceShape(8, 192, 2048),
    "p5en.48xlarge": InstanceShape(8, 192, 2048),
    "p6-b200.48xlarge": InstanceShape(8, 192, 2048),
}
# NVIDIA GPU instance families Karpenter can launch for training (EC2 accelerated computing, x86_64)
GPU_FAMILIES = tuple(dict.fromkeys(name.split(".")[0] for name in INSTANCE_SHAPES))


def family_sizes(families: Iterable[str]) -> tuple[str, ...]:
    """Every size one of ``families`` comes in, in the table's order."""
    return tuple(dict.fromkeys(name.split(".")[1] for name in INSTANCE_SHAPES if name.split(".")[0] in families))


def launchable(families: Iterable[str], sizes: Iterable[str] = ()) -> tuple[str, ...]:
    """The instance types of ``families`` in ``sizes`` (any size where it is empty)."""
    families, sizes = set(families), set(sizes)
    return tuple(name for name in INSTANCE_SHAPES
                 if name.split(".")[0] in families and (not sizes or name.split(".")[1] in sizes))
