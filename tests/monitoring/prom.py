"""Real Prometheus tools (Debian's ``prometheus`` package, which ``make test`` installs) and the step from a
Grafana query to plain PromQL. Tests that need the tools fail, never skip, when they are missing."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

# Grafana's interval variables, and dashboard variables used as a range (Ray's ``$window``).
_RANGE_VARIABLE = re.compile(r"\[\$\{?\w+\}?\]")
_VARIABLE = re.compile(r"\$\{?(\w+)\}?")


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: `make test` installs it (Debian package prometheus)")
    return path


def as_promql(expr: str) -> str:
    """What Grafana sends with every variable at "All": ranges of 1m, every other variable ``.*`` (dashboards use
    them only inside ``=~"..."`` matchers)."""
    expr = _RANGE_VARIABLE.sub("[1m]", expr)
    for match in _VARIABLE.finditer(expr):
        before = expr[:match.start()]
        assert before.endswith('=~"'), f"variable outside a regex matcher in {expr}"
    return _VARIABLE.sub(".*", expr)


def rules_file(groups: list[dict], directory: Path, name: str = "rules.yaml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=cwd)
