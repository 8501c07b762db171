"""A stack's deploy role, its inline policy under its boundary as the plan writes them, may do what ``pulumi up`` of
the stack calls on the stack's own resources, for every AWS stack: every read of a resource's settings (Pulumi's AWS
provider refreshes a resource by reading all of them, so one missing read fails the first ``pulumi up``), and every
change ``DEPLOY_ACTIONS`` lists for its type, with the context AWS gives that call: the tags it asks for when it
creates or tags, the resource's own tags and boundary otherwise. A failure names the type, the resource and the
action. The pipeline's own roles, the boundary and the OIDC providers are changed by the administrator's bootstrap
only; their reads are checked like any other."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest

from infra.aws.deploy_policy import CREATES, DEPLOY_ACTIONS, IMAGE_PUSH, pipeline_role_arns
from infra.plan import PlannedResource
from tests.infra.iam_eval import Request, allowed
from tests.infra.stack_targets import (
    ACCOUNT,
    AWS_STACKS,
    READING,
    DeployRole,
    Target,
    access_level,
    actions_on,
    deploy_role,
    requested,
    resource_of,
    resource_types,
    resourceless,
    target,
    targets,
)

# Reads of what a resource holds, not of its settings: the provider never calls them. Log events and queries, queue
# messages (a receive hides them from Karpenter), image layers, the Kubernetes API through the console, key material
# import, and IAM's access reports and simulations.
NOT_SETTINGS = frozenset({
    "logs:FilterLogEvents", "logs:GetLogGroupFields", "logs:GetLogRecord", "logs:GetQueryResults",
    "logs:StartLiveTail", "logs:StartQuery", "logs:Unmask", "sqs:ReceiveMessage", "ecr:BatchGetImage",
    "ecr:GetDownloadUrlForLayer", "eks:AccessKubernetesApi", "kms:GetParametersForImport",
    "iam:GenerateServiceLastAccessedDetails", "iam:SimulatePrincipalPolicy",
})


def settings_reads(t: Target) -> list[str]:
    """The Read and List actions on the resource's type, and its service's listings (Describe*, List*: what names no
    resource), less ``NOT_SETTINGS``."""
    listings = {a for a in resourceless(t.service, READING) if a.split(":")[1].startswith(("Describe", "List"))}
    return sorted((set(actions_on(t.service, t.resource_type, READING)) | listings) - NOT_SETTINGS)


def missing_reads(role: DeployRole, resources: list[Target]) -> list[str]:
    return sorted({f"{t.type}: {action}" for t in resources for action in settings_reads(t)
                   if not allowed(Request(action, resource_of(action, t), t.context()), role.identity, role.boundary)})


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_the_deploy_role_reads_every_setting_of_its_stacks_resources(stack_plans, stack):
    cfg, plan = stack_plans[stack]
    assert missing_reads(deploy_role(stack_plans, stack), targets(cfg, plan)) == []


def test_the_read_check_names_what_a_narrower_policy_misses(stack_plans):
    role = deploy_role(stack_plans, "prod")
    narrower = replace(role, identity=[{**p, "Statement": [
        {**s, "Action": [a for a in s["Action"] if a != "s3:Get*Configuration"]} if s["Sid"] == "Reads" else s
        for s in p["Statement"]]} for p in role.identity])
    cfg, plan = stack_plans["prod"]
    assert "aws:s3/bucket:Bucket: s3:GetAccelerateConfiguration" in missing_reads(narrower, targets(cfg, plan))


def adds_tags(action: str) -> bool:
    return access_level(action) == "Tagging" and not action.split(":")[1].startswith(("Untag", "DeleteTags"))


def calls(stack_plans, stack: str) -> Iterator[tuple[str, Request]]:
    """Each change ``pulumi up`` makes to the stack's resources (the pipeline's roles left out), as (what,
    request)."""
    cfg, plan = stack_plans[stack]
    pipeline = set(pipeline_role_arns(ACCOUNT, cfg.cluster_name))
    own = [t for t in targets(cfg, plan) if t.arn not in pipeline]
    for r in plan.resources:
        t = target(cfg, plan, r) if r.type.startswith("aws:") else None
        if t is not None and t.arn not in pipeline:
            yield from _calls_on(r, t, own)


def _calls_on(r: PlannedResource, t: Target, own: list[Target]) -> Iterator[tuple[str, Request]]:
    """A create with the tags it asks for, a tagging both then and later, anything else on the resource as it is;
    and a create or change that also names another of the stack's resources (a subnet's VPC, an association's
    subnet) on that one too."""
    asked = {r.inputs["key"]: r.inputs["value"]} if r.type == "aws:ec2/tag:Tag" else dict(t.tags)
    created_by = next((a for a in DEPLOY_ACTIONS[r.type] if a in CREATES), None)
    for action in [*DEPLOY_ACTIONS[r.type], *(IMAGE_PUSH if r.type == "aws:ecr/repository:Repository" else [])]:
        what = f"{r.type} {r.name}: {action}"
        if action in CREATES or (adds_tags(action) and created_by):
            yield f"{what} creating it", Request(action, resource_of(action, t), _creating(t, asked, created_by))
        if action not in CREATES:
            context = {**t.context(), **_asked(action, asked), **_chosen(r.inputs)}
            yield f"{what} on it", Request(action, resource_of(action, t), context)
        if access_level(action) != "Tagging":
            also = requested(asked) if action in CREATES else {}
            yield from ((f"{what} on {p.arn}", Request(action, resource_of(action, p), {**p.context(), **also}))
                        for p in own if p.resource_type != t.resource_type
                        and p.resource_type in resource_types(action))


def _creating(t: Target, tags: dict[str, str], created_by: str | None) -> dict:
    """The context of a create, and of the tagging that goes with it: the tags asked for, the create that tags an
    EC2 resource, the boundary a role is created with."""
    context: dict = requested(tags)
    if t.service == "ec2" and created_by:
        context["ec2:CreateAction"] = created_by.split(":")[1]
    if t.boundary:
        context["iam:PermissionsBoundary"] = t.boundary
    return context


def _asked(action: str, tags: dict[str, str]) -> dict:
    """What a change asks for: the tags it adds, the keys it removes."""
    if adds_tags(action):
        return requested(tags)
    return {"aws:TagKeys": sorted(tags)} if access_level(action) == "Tagging" else {}


def _chosen(inputs: dict) -> dict[str, str]:
    """What a call on a role chooses: the managed policy it attaches, the service its role is passed to (the one
    the role trusts)."""
    if "policyArn" in inputs:
        return {"iam:PolicyARN": inputs["policyArn"]}
    if "assumeRolePolicy" in inputs:
        (trust,) = json.loads(inputs["assumeRolePolicy"])["Statement"]
        return {"iam:PassedToService": trust["Principal"].get("Service", "")}
    return {}


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_the_deploy_role_makes_every_change_its_stacks_plan_needs(stack_plans, stack):
    role = deploy_role(stack_plans, stack)
    denied = sorted({what for what, request in calls(stack_plans, stack)
                     if not allowed(request, role.identity, role.boundary)})
    assert denied == []
