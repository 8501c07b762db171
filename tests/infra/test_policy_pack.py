"""The CrossGuard pack's wiring. The pack runs inside the Pulumi engine, which is not here, so the policy SDK
is replaced by a recorder of what the pack registers; the predicates themselves are tested in test_policies."""

import importlib.util
import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest

from infra.policies import POLICIES
from tests.repo import REPO


@pytest.fixture(scope="module")
def pack(request):
    registered: dict[str, Any] = {}
    sdk = types.ModuleType("pulumi_policy")
    vars(sdk).update(EnforcementLevel=SimpleNamespace(MANDATORY="mandatory"),
                     StackValidationPolicy=lambda **kw: SimpleNamespace(**kw),
                     PolicyPack=lambda **kw: registered.update(kw))
    saved = sys.modules.get("pulumi_policy")
    sys.modules["pulumi_policy"] = sdk
    try:
        spec = importlib.util.spec_from_file_location("spotray_policy_pack", REPO / "policy" / "__main__.py")
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    finally:
        sys.modules.pop("pulumi_policy")
        if saved is not None:
            sys.modules["pulumi_policy"] = saved
    return registered


def engine_resource(type_, name, props, protect=False):
    return SimpleNamespace(resource_type=type_, name=name, props=props, opts=SimpleNamespace(protect=protect))


def validate(pack, policy_name, resources) -> list[str]:
    policy = next(p for p in pack["policies"] if p.name == policy_name)
    reported: list[str] = []
    policy.validate(SimpleNamespace(resources=resources), reported.append)
    return reported


def test_every_policy_is_a_mandatory_stack_policy_of_the_pack(pack):
    assert pack["name"] == "spotray" and pack["enforcement_level"] == "mandatory"
    assert [p.name for p in pack["policies"]] == [p.name for p in POLICIES]


def test_the_pack_reports_violations_and_reads_the_environment_from_the_tags(pack):
    tags = {"spotray:project": "spotray", "spotray:stack": "s", "spotray:environment": "prod"}
    unprotected = engine_resource("aws:kms/key:Key", "k", {"tags": tags})
    assert validate(pack, "prod-protected", [unprotected]) == [
        "Key k: stateful resource in prod without protect and retainOnDelete"]
    assert validate(pack, "prod-protected", [engine_resource("aws:kms/key:Key", "k", {"tags": tags}, True)]) == []
    dev = engine_resource("aws:kms/key:Key", "k", {"tags": {**tags, "spotray:environment": "dev"}})
    assert validate(pack, "prod-protected", [dev]) == []
    assert validate(pack, "tagged", [engine_resource("aws:kms/key:Key", "k", {})])
