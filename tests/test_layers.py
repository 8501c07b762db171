"""The import rule, read off the source: a module imports only its own layer and the layers below it.

    training  <-  infra.kernel  <-  infra.aws | cluster | monitoring  <-  the root (the rest of infra, policy/,
                                                                          __main__.py)

The three provisioning layers are peers: none imports another. ``training`` imports no provisioning code at all,
so the training image runs without Pulumi. A module's name is its path: under training/ (the installed package,
``spotray``) or from the repository root (the Pulumi program's ``infra``, ``cluster``, ``monitoring``)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from tests.repo import REPO

# module prefix -> (layer, rank); the longest matching prefix decides a module's layer.
LAYERS = {"spotray": ("training", 0), "infra.kernel": ("kernel", 1), "infra.aws": ("aws", 2),
          "cluster": ("cluster", 2), "monitoring": ("monitoring", 2),
          "infra": ("root", 3), "policy": ("root", 3), "__main__": ("root", 3)}
SOURCES = ("training", "infra", "cluster", "monitoring", "policy", "__main__.py")
PACKAGES_ROOT = Path(*tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"][
    "where"])  # where the installed package's folder lies


def layer(module: str) -> tuple[str, int] | None:
    matches = [prefix for prefix in LAYERS if module == prefix or module.startswith(f"{prefix}.")]
    return LAYERS[max(matches, key=len)] if matches else None


def module_name(path: Path) -> str:
    relative = path.relative_to(REPO).with_suffix("")
    parts = relative.relative_to(PACKAGES_ROOT).parts if relative.is_relative_to(PACKAGES_ROOT) else relative.parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """Every import anywhere in the file (a function-level import counts too), absolute module names."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def violations(path: Path) -> list[str]:
    importer = layer(module_name(path))
    found = []
    for line, module in imported_modules(ast.parse(path.read_text(), str(path))):
        imported = layer(module)
        if importer is None or imported is None or imported[0] == importer[0]:
            continue
        if imported[1] >= importer[1]:
            found.append(f"{path.relative_to(REPO)}:{line} ({importer[0]}) imports {module} ({imported[0]})")
    return found


def python_files() -> list[Path]:
    files = []
    for source in SOURCES:
        path = REPO / source
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def test_no_module_imports_a_layer_above_or_beside_its_own():
    assert [v for path in python_files() for v in violations(path)] == []


@pytest.mark.parametrize(("source", "importer", "expected"), [
    ("from cluster.rayjob import rayjob\n", "infra/kernel/names.py",
     "(kernel) imports cluster.rayjob.rayjob"),
    ("from monitoring import rules\n", "cluster/charts.py",
     "(cluster) imports monitoring.rules (monitoring)"),
    ("def f():\n    from infra.plan import plan\n", "training/spotray/worker/loop.py",
     "training/spotray/worker/loop.py:2 (training)"),
    ("import infra.aws.iam\n", "monitoring/stack.py", "imports infra.aws.iam (aws)"),
    ("from infra.render import render\n", "infra/aws/eks.py",
     "(aws) imports infra.render.render (root)"),
])
def test_the_rule_catches_an_import_that_goes_up_or_sideways(tmp_path, monkeypatch, source, importer, expected):
    fake_repo = tmp_path / "repo"
    path = fake_repo / importer
    path.parent.mkdir(parents=True)
    path.write_text(source)
    monkeypatch.setattr(f"{__name__}.REPO", fake_repo)
    assert expected in " ".join(violations(path))


def test_imports_down_the_layers_pass(tmp_path, monkeypatch):
    path = tmp_path / "infra" / "program.py"
    path.parent.mkdir(parents=True)
    path.write_text("from cluster.rayjob import rayjob\nfrom infra.kernel import names\n"
                    "import spotray.config\n")
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert violations(path) == []
