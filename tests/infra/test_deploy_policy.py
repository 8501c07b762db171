"""The deploy role's policy and the permissions boundary, under Pulumi mocks for every AWS stack: every resource type
a plan creates has its actions, every action they name exists (policy-sentry's database), every role carries the
boundary, the deploy role holds no managed policy, the stacks attach only ``MANAGED_POLICIES`` and the boundary
refuses any other, and cloudsplaining (checkov's, in ``.venv-checkov``, offline) finds no privilege escalation in any
role's inline policy, while it does find one once the boundary condition is gone. ``test_deploy_isolation.py`` and
``test_deploy_sufficiency.py`` evaluate the policies: no stack's resources open to another's deploy role, and all
of its own open to what ``pulumi up`` does."""

import copy
import fnmatch
import json
import subprocess

import pytest
from policy_sentry.querying.actions import get_actions_for_service

from infra.aws.deploy_policy import (
    DEPLOY_ACTIONS,
    MANAGED_POLICIES,
    attachable_policy_arns,
    boundary_arn,
    boundary_policy,
    deploy_policy,
    managed_policy_arn,
    pipeline_role_arns,
)
from infra.kernel.settings import STACK_TAG
from tests.infra.iam_eval import EXPLICIT_DENY, Request, allowed, decide, matches
from tests.infra.stack_targets import ACCOUNT, AWS_STACKS
from tests.repo import REPO

ANALYSER = REPO / ".venv-checkov" / "bin" / "python"
_ESCALATIONS = """
import json, sys
from cloudsplaining.scan.policy_document import PolicyDocument
print(json.dumps([PolicyDocument(p).allows_privilege_escalation for p in json.load(sys.stdin)]))
"""


def escalations(policies: list[dict]) -> list[list[dict]]:
    """cloudsplaining's privilege-escalation findings in the Allow statements of each policy. It reads a Deny on
    some resources as a Deny on all, which would hide a path: leaving the Denies out is the stricter reading."""
    if not ANALYSER.exists():
        pytest.fail(f"{ANALYSER} is missing: `make test` installs checkov, which brings cloudsplaining")
    allows = [{**p, "Statement": [s for s in p["Statement"] if s["Effect"] == "Allow"]} for p in policies]
    proc = subprocess.run([str(ANALYSER), "-c", _ESCALATIONS], input=json.dumps(allows), capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(proc.stdout)


def inline_policies(plan) -> dict[str, dict]:
    """Every role's inline policy a stack writes (the boundary grants nothing by itself: it only caps)."""
    return {r.name: json.loads(r.inputs["policy"]) for r in plan.of_type("aws:iam/rolePolicy:RolePolicy")}


def denied(policy: dict, action: str, resource: str) -> bool:
    """Whether an unconditional Deny of ``policy`` matches ``action`` on ``resource``."""
    for statement in policy["Statement"]:
        actions, resources = statement["Action"], statement["Resource"]
        actions, resources = [actions] if isinstance(actions, str) else actions, (
            [resources] if isinstance(resources, str) else resources)
        if (statement["Effect"] == "Deny" and "Condition" not in statement
                and any(fnmatch.fnmatchcase(action, a) for a in actions)
                and any(fnmatch.fnmatchcase(resource, r) for r in resources)):
            return True
    return False


def test_every_aws_resource_type_of_every_stack_has_its_deploy_actions(stack_plans):
    created = {r.type for stack in AWS_STACKS for r in stack_plans[stack][1].resources if r.type.startswith("aws:")}
    missing = sorted(created - set(DEPLOY_ACTIONS))
    assert missing == [], f"add the actions of {missing} to DEPLOY_ACTIONS (infra/aws/deploy_policy.py)"
    assert set(DEPLOY_ACTIONS) <= created, "an entry for a type no stack creates"


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_every_role_carries_the_boundary_and_the_deploy_role_only_its_own_policy(stack_plans, stack):
    cfg, plan = stack_plans[stack]
    (boundary,) = plan.of_type("aws:iam/policy:Policy")
    assert boundary.inputs["name"] == f"{cfg.cluster_name}-boundary"
    assert json.loads(boundary.inputs["policy"]) == boundary_policy(ACCOUNT, cfg.cluster_name, cfg.stack)
    mocked_arn = f"arn:aws:mock:{cfg.region}:{ACCOUNT}:{boundary.name}"
    roles = plan.of_type("aws:iam/role:Role")
    assert len(roles) >= 6 and all(r.inputs["permissionsBoundary"] == mocked_arn for r in roles)
    deploy = f"{cfg.cluster_name}-github-deploy"
    attached = [a for a in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if a.inputs["role"] == deploy]
    assert attached == [], "the deploy role holds a managed policy (AdministratorAccess?)"
    (inline,) = [p for p in plan.of_type("aws:iam/rolePolicy:RolePolicy") if p.name.endswith("-deploy")]
    assert json.loads(inline.inputs["policy"]) == deploy_policy(ACCOUNT, cfg.cluster_name, cfg.stack)
    assert len(inline.inputs["policy"]) <= 10_240  # IAM's limit for a role's inline policies


def test_roles_are_created_and_changed_only_with_the_boundary_and_the_guards_hold():
    policy, prefix = deploy_policy(ACCOUNT, "spotray-prod", "prod"), "spotray-prod"
    (create,) = [s for s in policy["Statement"] if s["Sid"] == "RolesOnlyWithTheBoundary"]
    assert "iam:CreateRole" in create["Action"]
    assert create["Condition"] == {"StringEquals": {"iam:PermissionsBoundary": boundary_arn(ACCOUNT, prefix),
                                                    f"aws:RequestTag/{STACK_TAG}": "prod"}}
    boundary = boundary_policy(ACCOUNT, prefix, "prod")
    for document in (policy, boundary):
        assert denied(document, "iam:DeleteRolePermissionsBoundary", f"arn:aws:iam::{ACCOUNT}:role/any")
        assert denied(document, "iam:CreatePolicyVersion", boundary_arn(ACCOUNT, prefix))
        assert all(denied(document, "iam:UpdateAssumeRolePolicy", arn) for arn in pipeline_role_arns(ACCOUNT, prefix))
        assert denied(document, "iam:UpdateOpenIDConnectProviderThumbprint", "arn:aws:iam::1:oidc-provider/x")
    assert denied(boundary, "iam:CreateAccessKey", "*") and not denied(boundary, "iam:PassRole", "*")
    assert not denied(boundary, "iam:CreateInstanceProfile", "*")  # Karpenter's


def test_cloudsplaining_finds_no_escalation_in_any_policy_a_stack_writes(stack_plans):
    policies = {f"{stack}/{name}": document for stack in AWS_STACKS
                for name, document in inline_policies(stack_plans[stack][1]).items()}
    names = {name.rsplit("/", 1)[1] for name in policies}
    assert names >= {"github-deploy", "karpenter-controller", "storage-training"}
    found = dict(zip(policies, escalations(list(policies.values())), strict=True))
    assert {name: paths for name, paths in found.items() if paths} == {}


def test_a_role_write_without_the_boundary_condition_is_caught():
    policy = copy.deepcopy(deploy_policy(ACCOUNT, "spotray-prod", "prod"))
    for statement in policy["Statement"]:
        if "iam:PermissionsBoundary" in statement.get("Condition", {}).get("StringEquals", {}):
            del statement["Condition"]
            # cloudsplaining's paths need both
            statement.update(Resource="*", Action=[*_listed(statement["Action"]), "sts:AssumeRole"])
    (paths,) = escalations([policy])
    assert {path["type"] for path in paths} >= {"PutRolePolicy", "AttachRolePolicy"}


def test_every_action_the_policies_name_exists():
    """A misspelt action grants nothing and denies nothing: each one, or each wildcard, names an action of
    policy-sentry's database."""
    prefix = "spotray-prod"
    policies = (deploy_policy(ACCOUNT, prefix, "prod"), boundary_policy(ACCOUNT, prefix, "prod"))
    named = {a for p in policies for s in p["Statement"] for a in _listed(s["Action"]) if a != "*"}
    unknown = sorted(a for a in named if not any(matches(a, known, ignore_case=True)
                                                 for known in get_actions_for_service(a.split(":")[0])))
    assert unknown == []


def _listed(value) -> list[str]:
    return [value] if isinstance(value, str) else value


def test_the_stacks_attach_only_the_managed_policies_named_in_one_place(stack_plans):
    attached = {a.inputs["policyArn"] for stack in AWS_STACKS
                for a in stack_plans[stack][1].of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
    assert attached == {managed_policy_arn(p) for policies in MANAGED_POLICIES.values() for p in policies}


@pytest.mark.parametrize("policy", ["AdministratorAccess", "PowerUserAccess", "IAMFullAccess", "AmazonS3FullAccess"])
def test_no_role_of_a_stack_gets_another_managed_policy(policy):
    """Neither the deploy role may attach it to the stack's own roles, nor may any role under the boundary attach it
    anywhere; nor the boundary itself as a role's policy."""
    prefix, stack = "spotray-prod", "prod"
    boundary = boundary_policy(ACCOUNT, prefix, stack)
    own_role = {"iam:PermissionsBoundary": boundary_arn(ACCOUNT, prefix), f"iam:ResourceTag/{STACK_TAG}": stack,
                f"aws:ResourceTag/{STACK_TAG}": stack}
    role = f"arn:aws:iam::{ACCOUNT}:role/karpenter-node-0123abc"
    for arn in (managed_policy_arn(policy), boundary_arn(ACCOUNT, prefix)):
        attach = Request("iam:AttachRolePolicy", role, {**own_role, "iam:PolicyARN": arn})
        assert not allowed(attach, [deploy_policy(ACCOUNT, prefix, stack)], boundary)
        assert decide(attach, [{"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}],
                      boundary) == EXPLICIT_DENY
    for arn in attachable_policy_arns(ACCOUNT, prefix):
        attach = Request("iam:AttachRolePolicy", role, {**own_role, "iam:PolicyARN": arn.replace("*", "x")})
        assert allowed(attach, [deploy_policy(ACCOUNT, prefix, stack)], boundary)
