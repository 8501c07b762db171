import re
import tomllib

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from infra.kernel.versions import RAY_GPU_IMAGE, RAY_VERSION
from tests.repo import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_the_training_image_builds_on_the_pinned_ray_gpu_image():
    dockerfile = (REPO / "training" / "Dockerfile").read_text()
    pinned = re.search(r"^ARG RAY_IMAGE=(\S+)$", dockerfile, re.M)
    assert pinned and pinned.group(1) == RAY_GPU_IMAGE


def test_the_pinned_image_has_the_ray_and_python_the_package_requires():
    ray = next(Requirement(d) for d in PROJECT["dependencies"] if Requirement(d).name == "ray")
    assert Version(RAY_VERSION) in ray.specifier, f"pyproject requires {ray}, the image and RayJobs run {RAY_VERSION}"
    python = re.search(r"-py(\d)(\d+)-", RAY_GPU_IMAGE)
    assert python
    major, minor = python.groups()
    assert Version(f"{major}.{minor}") in SpecifierSet(PROJECT["requires-python"])


def test_the_training_image_leaves_out_virtualenvs_runs_and_git():
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", ".git", "spotray-runs"} <= set(ignored)
