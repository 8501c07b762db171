"""One installed name: the repository's folders import as ``spotray`` (training/spotray/) and ``spotray.infra``,
``spotray.cluster``, ``spotray.monitoring``, and what an earlier release wrote still loads."""

from __future__ import annotations

import ast
import shutil
import sys
import tomllib
from pathlib import Path

from spotray import status
from spotray.export import export
from spotray.loop import run_root
from tests.repo import REPO
from tests.training.configs import make_config
from tests.training.runs import train_locally

FOLDERS = ("training", "infra", "cluster", "monitoring")
RELEASE_0_1_RUN = REPO / "tests" / "fixtures" / "run-0.1.0"  # written by spotray 0.1.0: tiny GPT, 4 steps, 1 worker


def setuptools_table() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_installs_under_spotray():
    folder_of = setuptools_table()["package-dir"]
    assert folder_of == {"spotray": "training/spotray", "spotray.infra": "infra", "spotray.cluster": "cluster",
                         "spotray.monitoring": "monitoring"}
    packages = {".".join((name, *init.parent.relative_to(REPO / folder).parts))
                for name, folder in folder_of.items() for init in (REPO / folder).rglob("__init__.py")}
    assert set(setuptools_table()["packages"]) == packages


def test_no_module_imports_a_folder_by_its_bare_name():
    """From a user's project directory a bare ``training`` or ``infra`` is theirs, not spotray's."""
    sources = [*(p for folder in (*FOLDERS, "tests", "policy") for p in sorted((REPO / folder).rglob("*.py"))),
               REPO / "__main__.py"]
    bare = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            bare += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names if n.split(".")[0] in FOLDERS]
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
    assert exported["step"] == 4 and exported["files"] == ["model.safetensors"] and exported["config"]
    assert train_locally(cfg)["final_step"] == 6
    assert status.gather(run_root(cfg).url)["attempts"][-1]["from_step"] == 4  # resumed, not started over
