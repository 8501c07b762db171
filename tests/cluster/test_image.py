import re

from infra.kernel.versions import RAY_GPU_IMAGE, RAY_VERSION
from tests.repo import REPO


def test_the_training_image_builds_on_the_pinned_ray_gpu_image():
    dockerfile = (REPO / "training" / "Dockerfile").read_text()
    assert re.search(r"^ARG RAY_IMAGE=(\S+)$", dockerfile, re.M).group(1) == RAY_GPU_IMAGE
    assert RAY_VERSION in RAY_GPU_IMAGE


def test_the_training_image_leaves_out_virtualenvs_runs_and_git():
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", ".git", "spotray-runs"} <= set(ignored)
