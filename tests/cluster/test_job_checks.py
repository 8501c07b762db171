"""A config a RayJob's pods could not keep or read, or one that leaves its GPUs idle, is one line before anything
is applied; the stack's own storage is accepted (``cluster/job_checks.py``, through ``spotray submit``)."""

from dataclasses import replace

import pytest
import yaml

from cluster.job_checks import check_for_cluster
from cluster.rayjob import JobSettings
from cluster.submit import submit
from infra.cli import main
from infra.kernel.config import TrainingJobConfig
from infra.kernel.instances import launchable
from spotray.config import load
from spotray.errors import ConfigError
from tests.cluster.stacks import stack
from tests.repo import REPO

ELASTIC = "scaling.num_workers=8 train.global_batch_size=840"  # 840: every size from 4 to 8 divides it


@pytest.mark.parametrize(("override", "key", "says"), [
    ("checkpoint.path=./runs", "checkpoint.path", "lost with the pod at a preemption"),
    ("checkpoint.path=s3://team-bucket/ckpt", "checkpoint.path", "outside the stack's storage"),
    ("audit_dir=/tmp/audit", "audit_dir", "lost with the pod at a preemption"),
    ("data.path=./data", "data.path", "a path of this machine"),
    ("model.hf.pretrained=models/llama", "model.hf.pretrained", "a path of this machine"),
    ("scaling.use_gpu=false", "scaling.use_gpu", "GPU pool a10g-spot with 1 GPU(s) each, which would stay idle"),
    ("scaling.num_workers=8", "scaling.num_workers", "8 workers of 1 GPU(s) need 8 GPUs, over pool a10g-spot's "
                                                     "gpuLimit 4: the job would wait for nodes the pool never"),
    (f"scaling.min_workers=5 {ELASTIC}", "scaling.min_workers", "5 workers of 1 GPU(s) need 5 GPUs"),
])
def test_a_config_the_jobs_pods_cannot_keep_or_read_or_that_leaves_its_gpus_idle_is_one_line(project, override, key,
                                                                                             says, capsys):
    """A config tried on a laptop: its checkpoints would vanish with each pod, its data is not on the cluster, or
    it trains on CPU beside the GPUs it pays for. The fix names the stack's own storage."""
    sets = [arg for each in override.split() for arg in ("--set", each)]
    assert main(["submit", "--stack", "dev", "--config", str(project / "run.yaml"), *sets,
                 "--image", "r.example.com/t:9", "--dry-run", "--project-dir", str(REPO)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert f"'{key}'" in line and says in line, line
    assert "s3://spotray-dev/spotray/" in line or key.startswith("scaling."), line


@pytest.mark.parametrize("overrides", [["checkpoint.path=s3://spotray-dev-datasets/spotray/ckpt"],
                                       ["data.path=/opt/data"], ["model.hf.pretrained=s3://models/llama"],
                                       [*ELASTIC.split(), "scaling.min_workers=4"]])
def test_the_stacks_buckets_an_absolute_path_in_the_image_a_model_in_any_bucket_and_a_shrinkable_size_are_accepted(
        project, overrides):
    cfg = load(str(project / "run.yaml"), overrides)
    assert len(list(yaml.safe_load_all(submit(cfg, stack(project), image="r.example.com/t:9", dry_run=True)))) == 2


def test_a_pod_wider_than_its_pools_gpu_limit_is_told_the_limit_it_needs(project):
    settings = JobSettings(image="r.example.com/t:9", gpu_pool="h100-spot", pool_gpu_limit=4,
                           job=TrainingJobConfig(gpus_per_worker=8))
    with pytest.raises(ConfigError, match=r"16 workers \(8 to a pod of 8 GPUs\) need 16 GPUs, over pool h100-spot's "
                                          r"gpuLimit 4.*\. raise the pool's gpuLimit to 16$"):
        check_for_cluster(load(str(project / "run.yaml"), ["scaling.num_workers=16",
                                                           "train.global_batch_size=16"]), settings)


@pytest.mark.parametrize(("job", "overrides", "says"), [
    (TrainingJobConfig(gpus_per_worker=8), [],
     r"'spotray:training.gpusPerWorker': is 8, but pool a10g-spot's nodes have at most 1 GPU\(s\): its "
     r"workers would wait for a node the pool never launches. use at most 1, or let the pool launch g5.48xlarge"),
    (TrainingJobConfig(cpus_per_worker=16), [],
     r"'spotray:training.cpusPerWorker': is 16, .* at most 15 \(g5.4xlarge: 16 vCPUs, one kept by the node\): .* "
     r"use at most 15, or let the pool launch g5.8xlarge"),
    (TrainingJobConfig(memory_gib_per_worker=58), [],
     r"'spotray:training.memoryGiBPerWorker': is 58, .* at most 57 GiB \(g5.4xlarge: 64 GiB, a tenth kept by the "
     r"node\): .* ask at most 57 GiB in all, or let the pool launch g5.8xlarge"),
    (TrainingJobConfig(), ["snapshot.max_gb_per_node=30"],
     r"'spotray:training.memoryGiBPerWorker': is 32 \+ 28 for snapshot.max_gb_per_node, .* ask at most 57 GiB in all "
     r"\(snapshot.max_gb_per_node counts\)"),
])
def test_a_worker_no_node_of_its_pool_holds_names_the_setting_and_the_largest_that_fits(project, job, overrides,
                                                                                      says):
    """The dev stack's pool launches g5.xlarge to g5.4xlarge; a worker asking more GPUs, CPUs or memory than the
    largest leaves would wait for a node Karpenter never launches, with nothing said."""
    settings = JobSettings(image="r.example.com/t:9", gpu_pool="a10g-spot", job=job,
                           pool_instance_types=launchable(["g5"], ["xlarge", "2xlarge", "4xlarge"]))
    with pytest.raises(ConfigError, match=f"^config {says}"):
        check_for_cluster(load(str(project / "run.yaml"), overrides), settings)
    check_for_cluster(load(str(project / "run.yaml")), replace(settings, job=TrainingJobConfig()))


@pytest.mark.parametrize(("overrides", "says"), [
    (["scaling.num_workers=12"], "'scaling.num_workers': 12 workers do not fill worker pods of 8 GPUs (8 workers each, "
                                 "spotray:training.gpusPerWorker): 4 GPU(s) of the last would be paid and idle. use a "
                                 "multiple of 8"),
    (["scaling.min_workers=4"], "'scaling.min_workers': 4 workers do not fill worker pods of 8 GPUs"),
    (["scaling.resources_per_worker={GPU: 3}"], "'scaling.resources_per_worker.GPU': each worker asks 3 GPU(s), which "
                                                "do not divide a worker pod's 8"),
    (["scaling.resources_per_worker={GPU: 1, CPU: 16}"], "'scaling.resources_per_worker.CPU': 8 workers of a pod ask "
                                                         "128 CPUs, more than its 96"),
    (["scaling.min_workers=8"], "'scaling.workers_per_node': is 1, but the job's pods run 8 workers each (spotray:"
                                "training.gpusPerWorker), and a lost pod takes them all. set scaling.workers_per_node: "
                                "8"),
])
def test_workers_that_leave_a_pods_gpus_idle_or_cannot_share_it_are_one_line(project, overrides, says):
    """Pods of 8 GPUs run 8 workers each: a worker count, or a worker size, that leaves GPUs of a pod without a
    worker pays for them idle; workers asking more CPUs than the pod has are never placed."""
    settings = JobSettings(image="r.example.com/t:9", gpu_pool="h100-spot", pool_instance_types=("p5.48xlarge",),
                           job=TrainingJobConfig(gpus_per_worker=8, cpus_per_worker=96, memory_gib_per_worker=1024))
    run = ["scaling.num_workers=16", "train.global_batch_size=720720", *overrides]  # every size from 4 to 16 divides
    with pytest.raises(ConfigError) as raised:
        check_for_cluster(load(str(project / "run.yaml"), run), settings)
    assert says in str(raised.value), raised.value
    check_for_cluster(load(str(project / "run.yaml"), ["scaling.num_workers=16", "scaling.min_workers=8",
                                                       "scaling.workers_per_node=8", "train.global_batch_size=48"]),
                      settings)
