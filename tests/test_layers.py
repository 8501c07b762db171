"""The import rule, read off the source: a module imports only its own layer and the layers below it; inside the
package ``spotray``, only its own package and the packages below it.

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


# The package spotray, lowest first (each package's docstring says the same): a module imports the base modules at the
# package's root, its own package and the packages before it. The rest of the root (cli, demo, export, hf) and the
# packages of commands, drills and examples, TOP_PACKAGES, may import any of them; none of them imports those.
SPOTRAY_BASE = ("config", "errors", "storage", "renames", "formats", "ray_local", "ray_nodes")
SPOTRAY_PACKAGES = ("accounts", "checkpoints", "snapshots", "data", "tasks", "tracking", "step", "worker",
                    "survivors", "reports", "planning", "driver")
TOP_PACKAGES = ("bench", "drills", "examples", "configs")


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


def spotray_layer(module: str) -> tuple[str, int] | None:
    parts = module.split(".")
    if parts[0] != "spotray":
        return None
    head = parts[1] if len(parts) > 1 else ""
    if head in SPOTRAY_BASE:
        return "base", 0
    if head in SPOTRAY_PACKAGES:
        return head, 1 + SPOTRAY_PACKAGES.index(head)
    return "top", 1 + len(SPOTRAY_PACKAGES)


def package_violations(path: Path) -> list[str]:
    importer = spotray_layer(module_name(path))
    if importer is None or importer[0] == "top":
        return []
    found = []
    for line, module in imported_modules(ast.parse(path.read_text(), str(path))):
        imported = spotray_layer(module)
        if imported is None or imported[0] == importer[0]:
            continue
        if imported[1] >= importer[1]:
            found.append(f"{path.relative_to(REPO)}:{line} (spotray.{importer[0]}) imports {module} "
                         f"(spotray.{imported[0]})")
    return found


def python_files() -> list[Path]:
    files = []
    for source in SOURCES:
        path = REPO / source
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def test_no_module_imports_a_layer_above_or_beside_its_own():
    assert [v for path in python_files() for v in violations(path)] == []


def test_no_module_of_spotray_imports_a_package_above_or_beside_its_own():
    assert [v for path in python_files() for v in package_violations(path)] == []


def spotray_imports() -> dict[str, set[str]]:
    """module -> the modules of spotray it imports anywhere."""
    files = {module_name(path): path for path in (REPO / PACKAGES_ROOT / "spotray").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        imported = set()
        for _, name in imported_modules(ast.parse(path.read_text(), str(path))):
            while name and name not in files:  # spotray.x.y.name -> the module spotray.x.y
                name = name.rpartition(".")[0]
            if name and name != module:
                imported.add(name)
        graph[module] = imported
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One path for each import cycle found by a depth-first walk."""
    found, done, path = [], set(), []

    def walk(module: str) -> None:
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            if imported in path:
                found.append(path[path.index(imported):] + [imported])
            elif imported not in done:
                walk(imported)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            walk(module)
    return found


def test_no_modules_of_spotray_import_each_other_in_a_cycle():
    assert cycles(spotray_imports()) == []


def test_the_cycle_check_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_every_package_of_spotray_has_its_place_in_the_order():
    package = REPO / PACKAGES_ROOT / "spotray"
    folders = {path.name for path in package.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders == set(SPOTRAY_PACKAGES) | set(TOP_PACKAGES)


@pytest.mark.parametrize(("source", "importer", "expected"), [
    ("from spotray.worker.loop import train\n", "training/spotray/accounts/cost.py",
     "(spotray.accounts) imports spotray.worker.loop.train (spotray.worker)"),
    ("def f():\n    from spotray.driver import launch\n", "training/spotray/config.py",
     "training/spotray/config.py:2 (spotray.base) imports spotray.driver.launch (spotray.driver)"),
    ("from spotray.reports import status\n", "training/spotray/planning/planner.py", ""),
    ("from spotray import cli\n", "training/spotray/tasks/gpt.py", "imports spotray.cli (spotray.top)"),
])
def test_the_package_rule_catches_an_import_that_goes_up_or_sideways(tmp_path, monkeypatch, source, importer,
                                                                     expected):
    path = tmp_path / importer
    path.parent.mkdir(parents=True)
    path.write_text(source)
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert expected in " ".join(package_violations(path)) if expected else package_violations(path) == []


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
