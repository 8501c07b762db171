"""Stack configs with the training job enabled, for the cluster tests."""

from infra.kernel.config import StackConfig, from_values

AWS = {
    "network": {"availabilityZones": ["us-west-2a", "us-west-2b"]},
    "kubernetes": {"publicAccessCidrs": ["203.0.113.0/24"]},
    "gpuPools": [{"name": "a10g-spot", "families": ["g5"]}],
}
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/spotray/dev/training:3f2a1c"


def stack(project, backend="minio", gpu_pools=None, monitoring=None, **training) -> StackConfig:
    values = {**AWS, **({"gpuPools": gpu_pools} if gpu_pools else {}), "storage": {"backend": backend},
              **({"monitoring": monitoring} if monitoring else {}),
              "training": {"enabled": True, "config": "run.yaml", "image": IMAGE, **training}}
    return from_values("spotray", "dev", values, "us-west-2", project)
