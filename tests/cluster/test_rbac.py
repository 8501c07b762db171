"""The Ray head's right to read nodes (``cluster/rbac.py``), as the render carries it: valid for the stack's
Kubernetes version, ``get`` on nodes and nothing else, bound to the head's own service account only."""

import kubernetes_validate
import pytest

from cluster.rbac import head_access
from infra.kernel.names import TRAINING_NAMESPACE
from infra.render import render
from tests.cluster.test_render import check_valid

RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
HEAD = {"kind": "ServiceAccount", "name": "spotray-head", "namespace": "spotray"}


@pytest.fixture(scope="module")
def rendered(stack_plans):
    cfg, planned = stack_plans["dev"]
    return cfg, render(cfg, planned).objects


def of_kinds(objects: dict, *kinds: str) -> list[dict]:
    return [obj for obj in objects.values() if obj["kind"] in kinds]


def test_the_render_holds_the_builders_head_account_role_and_binding_valid_for_the_stacks_kubernetes(rendered):
    cfg, objects = rendered
    built = head_access(TRAINING_NAMESPACE)
    for obj in built:
        meta = obj["metadata"]
        path = f"objects/{meta.get('namespace', '_cluster')}/{obj['kind'].lower()}-{meta['name']}.yaml"
        assert objects[path] == obj  # what Pulumi creates is what the builder made
        check_valid(obj, cfg.kubernetes.version)


def test_the_rbac_in_the_render_grants_reading_nodes_and_nothing_else_to_the_head_only(rendered):
    _, objects = rendered
    (role,) = of_kinds(objects, "Role", "ClusterRole")
    assert role["metadata"]["name"] == "spotray-node-reader"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]
    assert "aggregationRule" not in role
    (binding,) = of_kinds(objects, "RoleBinding", "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "spotray-node-reader"}
    assert binding["subjects"] == [HEAD]
    accounts = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in of_kinds(objects, "ServiceAccount")}
    assert ("spotray", "spotray-head") in accounts


def test_strict_validation_catches_a_wrong_rbac_field(rendered):
    cfg, objects = rendered
    (role,) = of_kinds(objects, "ClusterRole")
    broken = {**role, "rules": [{"apiGroup": [""], "resources": ["nodes"], "verbs": ["get"]}]}
    with pytest.raises(kubernetes_validate.ValidationError):
        check_valid(broken, cfg.kubernetes.version)


def test_the_head_account_and_its_binding_come_with_the_training_namespace(stack_plans):
    _, planned = stack_plans["dev"]
    namespace = planned.named("training")
    for name in ("training-serviceaccount-spotray-head", "training-clusterrole-spotray-node-reader",
                 "training-clusterrolebinding-spotray-node-reader-spotray"):
        assert planned.named(name).parent == namespace.name, name
    assert "training-namespace" in planned.named("training-serviceaccount-spotray-head").depends_on
