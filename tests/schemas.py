"""The reference data in ``../shared``: upstream CRD schemas and pinned charts' default values.

Tests that need it fail (never skip) when it is missing, so CI cannot pass without checking manifests."""

from __future__ import annotations

import copy
import os
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import yaml

SHARED = Path(os.environ.get("SPOTRAY_SHARED", Path(__file__).resolve().parents[2] / "shared"))


def shared_file(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.fail(f"{path} is missing: the tests need ../shared beside the repository (or SPOTRAY_SHARED)")
    return path


@cache
def _crd_schema(file: str, version: str) -> dict:
    crd = yaml.safe_load(shared_file("crds", file).read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
    return _strict(copy.deepcopy(schema))


def _strict(schema: dict) -> dict:
    """Unknown fields are errors, as with server-side apply's strict field validation."""
    if schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        schema["additionalProperties"] = False
    for child in schema.get("properties", {}).values():
        _strict(child)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            _strict(schema[key])
    return schema


def validate_custom_resource(obj: dict, crd_file: str) -> None:
    """Raises jsonschema.ValidationError naming the first field that the CRD rejects."""
    version = obj["apiVersion"].rsplit("/", 1)[1]
    jsonschema.Draft7Validator(_crd_schema(crd_file, version)).validate(obj)


@cache
def chart_defaults(file: str) -> dict:
    return yaml.safe_load(shared_file("charts", file).read_text())


# Values that are free-form maps in every chart: any key is valid below them.
FREE_FORM = {"nodeSelector", "labels", "annotations", "podLabels", "podAnnotations", "resources"}


def unknown_values_keys(values: dict, defaults: dict, prefix: str = "") -> list[str]:
    """Dotted keys set in ``values`` that the chart's values.yaml does not have. Below a free-form map, or a map
    the chart leaves empty, any key is valid."""
    missing = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if key not in defaults:
            missing.append(path)
        elif isinstance(value, dict) and isinstance(defaults[key], dict) and defaults[key] and key not in FREE_FORM:
            missing += unknown_values_keys(value, defaults[key], f"{path}.")
    return missing


# Subcharts whose values a parent passes on under their name: (parent, version) -> {key: (subchart, its version)}.
SUBCHARTS = {("kube-prometheus-stack", "88.5.3"): {"grafana": ("grafana", "12.11.1")}}


def pinned_chart_values(chart: str, version: str) -> dict:
    """The values.yaml of a chart (``name``, or an ``oci://.../name`` reference) at ``version``; under a subchart's
    key it has the keys of both, since the parent reads some of them too."""
    name = chart.rsplit("/", 1)[-1]
    found = sorted(shared_file("charts").glob(f"*{name}-{version}.values.yaml"))
    if not found:
        pytest.fail(f"no values.yaml of chart {name} {version} in {SHARED / 'charts'}: add the pinned chart's")
    defaults = copy.deepcopy(chart_defaults(found[0].name))
    for key, (subchart, subchart_version) in SUBCHARTS.get((name, version), {}).items():
        defaults[key] = merged(pinned_chart_values(subchart, subchart_version), defaults.get(key) or {})
    return defaults


def merged(base: dict, overlay: dict) -> dict:
    """``overlay`` over ``base``, maps merged key by key (as Helm merges values over a chart's defaults)."""
    out = dict(base)
    for key, value in overlay.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
