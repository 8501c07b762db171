"""One installed name, ``spotray``, whose modules are their files under training/ (no import hook: editors and type
checkers follow them); the Pulumi program's packages are not installed; and what an earlier release wrote still
loads."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import setuptools
from packaging.requirements import Requirement

from spotray.export import export
from spotray.reports import status
from spotray.worker.attempt import run_root
from tests.repo import REPO
from tests.training.configs import make_config
from tests.training.runs import train_locally

RELEASE_0_1_RUN = REPO / "tests" / "fixtures" / "run-0.1.0"  # written by spotray 0.1.0: tiny GPT, 4 steps, 1 worker
# Written at 9a2ea7f, the settings below, when every module lay flat in spotray/: its .metadata names
# spotray.checkpoints.dcp classes; written.json holds its parameters' SHA-256.
FLAT_PACKAGE_RUN = REPO / "tests" / "fixtures" / "run-flat-package"


def setuptools_table() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_the_wheel_holds_spotray_alone_and_every_module_imports_from_its_own_file():
    assert setuptools_table() == {"packages": {"find": {"where": ["training"]}},
                                  "package-data": {"spotray": ["configs/*.yaml"]}}
    assert {name.split(".")[0] for name in setuptools.find_packages(REPO / "training")} == {"spotray"}
    modules = sorted((REPO / "training" / "spotray").rglob("*.py"))
    for path in modules:
        parts = path.relative_to(REPO / "training").with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        assert Path(spec.origin) == path, name
    assert not [finder for finder in sys.meta_path if "editable" in type(finder).__module__.lower()]


def test_what_the_package_imports_as_it_loads_is_among_its_dependencies():
    """A user's `pip install spotray` has the dependencies only, not the dev extra the tests run with (psutil was
    there alone). The benches, drills and examples are the repository's tooling, run with the dev extra."""
    declared = {Requirement(r).name.lower()
                for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    owners = packages_distributions()
    missing = []
    for path in sorted((REPO / "training" / "spotray").rglob("*.py")):
        if path.relative_to(REPO / "training" / "spotray").parts[0] in ("bench", "drills", "examples"):
            continue
        for node in ast.parse(path.read_text()).body:  # the module's own imports, not those in its functions
            if isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0):
                for name in [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]:
                    top = str(name).split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ("spotray", "__future__") and not {
                            d.lower() for d in owners.get(top, [top])} & declared:
                        missing.append(f"{path.relative_to(REPO)}: {top}")
    assert not missing


def test_no_module_imports_the_training_folder_by_its_name():
    """``training`` is where the package lies, not a package: from a user's project directory it is theirs."""
    sources = [*(p for folder in ("training", "infra", "cluster", "monitoring", "tests", "policy")
                 for p in sorted((REPO / folder).rglob("*.py"))), REPO / "__main__.py"]
    bare = []
    for path in sources:
        tree = ast.parse(path.read_text(), str(path))
        for node in (n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if node.level == 0 and node.module else [])
            bare += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names if n.split(".")[0] == "training"]
    assert bare == []


def release_0_1_config(data: str, root: Path, *overrides: str):
    """The settings the fixture was trained with (plus ``overrides``)."""
    return make_config(data, str(root), "v0", "scaling.num_workers=1", "model.n_layer=1", "model.n_head=2",
                       "model.n_embd=16", "train.global_batch_size=4", "train.max_steps=4",
                       "checkpoint.every_steps=4", "checkpoint.keep_last=1", *overrides)


def test_a_checkpoint_written_by_release_0_1_resumes_and_exports(dataset_url, tmp_path, monkeypatch):
    """Its .metadata names training.checkpoint classes; the bare name ``training`` is not importable here, as it is
    not (or is a user's own package) where spotray is installed."""
    shutil.copytree(RELEASE_0_1_RUN, tmp_path / "runs" / "v0")
    cfg = release_0_1_config(dataset_url, tmp_path / "runs", "train.max_steps=6")
    monkeypatch.setitem(sys.modules, "training", None)
    exported = export(run_root(cfg).url, str(tmp_path / "model"))
    assert exported["step"] == 4 and exported["files"] == ["model.safetensors"]
    assert exported["config"] == ["config.json"]
    assert train_locally(cfg)["final_step"] == 6
    assert status.gather(run_root(cfg).url)["attempts"][-1]["from_step"] == 4  # resumed, not started over


def test_a_checkpoint_written_when_the_modules_lay_flat_restores_bitwise_and_resumes(dataset_url, tmp_path):
    shutil.copytree(FLAT_PACKAGE_RUN / "checkpoints", tmp_path / "runs" / "flat" / "checkpoints")
    written = json.loads((FLAT_PACKAGE_RUN / "written.json").read_text())
    cfg = release_0_1_config(dataset_url, tmp_path / "runs", "run.name=flat")
    restored = train_locally(cfg)  # at the checkpoint's step: nothing to train
    assert status.gather(run_root(cfg).url)["attempts"][-1]["from_step"] == written["step"]  # not started over
    assert (restored["final_step"], restored["param_sha256"]) == (written["step"], written["param_sha256"])
    assert train_locally(release_0_1_config(dataset_url, tmp_path / "runs", "run.name=flat",
                                            "train.max_steps=6"))["final_step"] == 6
