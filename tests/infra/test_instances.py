"""The GPU instance shapes a pool's worker fit is checked against are EC2's own: every type of the GPU families in
DescribeInstanceTypes' data (as moto ships it, taken from the real API), with its GPUs, vCPUs and memory."""

import gzip
import json
from importlib.resources import files

from infra.kernel.instances import GPU_FAMILIES, INSTANCE_SHAPES, InstanceShape, family_sizes, launchable


def describe_instance_types() -> dict[str, dict]:
    return json.loads(gzip.decompress(files("moto.ec2").joinpath("resources/instance_types.json.gz").read_bytes()))


def test_the_shapes_are_ec2s_for_every_type_of_the_gpu_families():
    ec2 = {name: InstanceShape(sum(gpu["Count"] for gpu in info["GpuInfo"]["Gpus"]), info["VCpuInfo"]["DefaultVCpus"],
                               info["MemoryInfo"]["SizeInMiB"] // 1024)
           for name, info in describe_instance_types().items() if name.split(".")[0] in GPU_FAMILIES}
    assert INSTANCE_SHAPES == ec2


def test_a_pool_launches_its_families_types_in_its_sizes_or_in_any_size():
    assert launchable(["g5"], ["xlarge", "48xlarge"]) == ("g5.xlarge", "g5.48xlarge")
    assert launchable(["p5", "p4d"]) == ("p4d.24xlarge", "p5.4xlarge", "p5.48xlarge")
    assert family_sizes(["gr6", "p5"]) == ("4xlarge", "8xlarge", "48xlarge")
