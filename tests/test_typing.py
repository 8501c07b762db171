"""The type checker (mypy, configured in pyproject.toml; make test runs it over the package and the tests) resolves
``spotray`` from the source tree, public API included."""

import ast
import re
import subprocess
import sys

import spotray
from tests.repo import REPO

THROWAWAY = """import spotray
from spotray.errors import ConfigError

spotray.should_save("after the last step")
workers: int = ConfigError("model.task", "no such module")
"""


def test_mypy_follows_spotray_into_the_tree_and_reports_exactly_the_planted_errors(tmp_path):
    path = tmp_path / "throwaway.py"
    path.write_text(THROWAWAY)
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", str(path)], cwd=REPO,
                            capture_output=True, text=True)
    errors = re.findall(r"^.*?throwaway\.py:(\d+: error: .*)$", result.stdout, re.M)
    assert errors == [
        '4: error: Argument 1 to "should_save" has incompatible type "str"; expected "int"  [arg-type]',
        '5: error: Incompatible types in assignment (expression has type "ConfigError", variable has type "int")  '
        "[assignment]",
    ], result.stdout + result.stderr


def test_the_checker_sees_every_public_name_from_the_module_that_serves_it():
    """``spotray.__init__`` imports its public names lazily (__getattr__) and again under TYPE_CHECKING: the two
    must name the same modules."""
    tree = ast.parse((REPO / "training" / "spotray" / "__init__.py").read_text())
    [block] = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    typed = {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    served = {**spotray._PUBLIC, **dict.fromkeys(spotray._MODULES, "spotray")}
    assert typed == served
