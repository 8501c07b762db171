"""A config a RayJob's pods could not keep or read, or one that leaves its GPUs idle, is one line before anything
is applied; the stack's own storage is accepted (``cluster/job_checks.py``, through ``spotray submit``)."""

import pytest
import yaml

from cluster.submit import submit
from infra.cli import main
from spotray.config import load
from tests.cluster.stacks import stack
from tests.repo import REPO


@pytest.mark.parametrize(("override", "key", "says"), [
    ("checkpoint.path=./runs", "checkpoint.path", "lost with the pod at a preemption"),
    ("checkpoint.path=s3://team-bucket/ckpt", "checkpoint.path", "outside the stack's storage"),
    ("audit_dir=/tmp/audit", "audit_dir", "lost with the pod at a preemption"),
    ("data.path=./data", "data.path", "a path of this machine"),
    ("model.hf.pretrained=models/llama", "model.hf.pretrained", "a path of this machine"),
    ("scaling.use_gpu=false", "scaling.use_gpu", "GPU pool a10g-spot with 1 GPU(s) each, which would stay idle"),
])
def test_a_config_the_jobs_pods_cannot_keep_or_read_or_that_leaves_its_gpus_idle_is_one_line(project, override, key,
                                                                                             says, capsys):
    """A config tried on a laptop: its checkpoints would vanish with each pod, its data is not on the cluster, or
    it trains on CPU beside the GPUs it pays for. The fix names the stack's own storage."""
    assert main(["submit", "--stack", "dev", "--config", str(project / "run.yaml"), "--set", override,
                 "--image", "r.example.com/t:9", "--dry-run", "--project-dir", str(REPO)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert f"'{key}'" in line and says in line, line
    assert "s3://spotray-dev/spotray/" in line or key == "scaling.use_gpu", line


@pytest.mark.parametrize("override", ["checkpoint.path=s3://spotray-dev-datasets/spotray/ckpt",
                                      "data.path=/opt/data", "model.hf.pretrained=s3://models/llama"])
def test_the_stacks_buckets_an_absolute_path_in_the_image_and_a_model_in_any_bucket_are_accepted(project, override):
    cfg = load(str(project / "run.yaml"), [override])
    assert len(list(yaml.safe_load_all(submit(cfg, stack(project), image="r.example.com/t:9", dry_run=True)))) == 2
