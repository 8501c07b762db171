"""One stack's deploy role cannot change another stack's resources, in one AWS account: for every ordered pair of the
AWS stacks, the deploy role of the first, its inline policy under its boundary as the plan writes them, is allowed no
mutating action (policy-sentry's Write, Permissions management and Tagging actions for the resource's type) on any
resource the second stack plans, found by its ARN, nor on any resource whose tag, or whose requested tag, names the
second stack. The last test shows the check catching the policy this replaced, whose changes applied to every
resource."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import permutations

import pytest

from infra.aws.deploy_policy import DEPLOY_ACTIONS
from infra.kernel.names import DISCOVERY_TAG
from infra.kernel.settings import STACK_TAG
from tests.infra.stack_targets import (
    AWS_STACKS,
    MUTATING,
    DeployRole,
    Target,
    actions_on,
    deploy_role,
    requested,
    resource_of,
    resourceless,
    targets,
)

PAIRS = list(permutations(AWS_STACKS, 2))
OTHER_STACK_GUARDS = ("NotAnotherStacksResources", "NotForAnotherStack")  # the boundary's Sids


def resources_of(stack_plans, stack: str) -> list[Target]:
    """The resources a stack plans, each ARN once (a bucket's settings name the bucket)."""
    cfg, plan = stack_plans[stack]
    return list({t.arn: t for t in targets(cfg, plan)}.values())


def mutations(role: DeployRole, resources: list[Target], requests: dict[str, dict],
              actions: Callable[[Target], tuple[str, ...]] = lambda t: actions_on(t.service, t.resource_type,
                                                                                  MUTATING)) -> list[str]:
    """Every one of the ``actions`` ``role`` may do on one of ``resources``, with one of the ``requests`` (label ->
    what the request asks for, besides what the resource itself puts in the context)."""
    return [f"{action} on {resource_of(action, t)} ({label})" for t in resources for action in actions(t)
            for label, asked in requests.items() if role.may(action, t, {**t.context(), **asked})]


def by_arn(role: DeployRole, resources: list[Target]) -> list[str]:
    """Mutations of another stack's resources, named by their ARNs and carrying their own tags, whatever the
    request asks for: nothing, the role's own stack tag, or Karpenter's discovery tag for the role's cluster."""
    return mutations(role, resources, {"as planned": {}, "asking for its own stack's tag": requested({
        STACK_TAG: role.stack}), "asking for its cluster's discovery tag": requested({DISCOVERY_TAG: role.prefix})})


def by_tag(role: DeployRole, other: str, own: list[Target]) -> list[str]:
    """Mutations of resources that carry the ``other`` stack's tag, or of requests that ask for it: on the role's
    own resources' ARNs, which their names or tags would otherwise open to it (but a bucket's name, S3 has no tags
    for IAM), and by the actions that name no resource (a cluster, a key: creates)."""
    claimed = [replace(t, tags={**t.tags, STACK_TAG: other}) for t in own if t.tags_in_context]
    asking = {"asking for the other stack's tag": requested({STACK_TAG: other})}
    one_per_service = list({t.service: t for t in own}.values())
    return [*mutations(role, claimed, {"tagged for the other stack": {}}), *mutations(role, own, asking),
            *mutations(role, one_per_service, asking, lambda t: resourceless(t.service, MUTATING))]


@pytest.mark.parametrize(("stack", "other"), PAIRS)
def test_a_deploy_role_changes_nothing_another_stack_plans_named_by_its_arn(stack_plans, stack, other):
    found = by_arn(deploy_role(stack_plans, stack), resources_of(stack_plans, other))
    assert found == [], f"{stack}'s deploy role may change {other}'s resources: {found[:20]}"


@pytest.mark.parametrize(("stack", "other"), PAIRS)
def test_a_deploy_role_changes_nothing_tagged_or_being_tagged_for_another_stack(stack_plans, stack, other):
    found = by_tag(deploy_role(stack_plans, stack), other, resources_of(stack_plans, stack))
    assert found == [], f"{stack}'s deploy role may change what is tagged for {other}: {found[:20]}"


def test_the_check_catches_the_policy_it_replaced(stack_plans):
    """Its changes applied to every resource, and the boundary had no rule about other stacks: dev's deploy role
    could delete prod's network, cluster, key, queue and bucket. Under today's boundary it still reaches prod's
    bucket, which S3 knows by name only."""
    role = deploy_role(stack_plans, "dev")
    every_change = sorted({a for actions in DEPLOY_ACTIONS.values() for a in actions if not a.startswith("iam:")})
    everywhere = replace(role, identity=[{**p, "Statement": [*p["Statement"], {
        "Sid": "StackResources", "Effect": "Allow", "Action": every_change, "Resource": "*"}]} for p in role.identity])
    old = replace(everywhere, boundary={**role.boundary, "Statement": [
        s for s in role.boundary["Statement"] if s["Sid"] not in OTHER_STACK_GUARDS]})
    prod = resources_of(stack_plans, "prod")
    arns = {t.type: t.arn for t in targets(*stack_plans["prod"])}
    deletes = {"aws:ec2/vpc:Vpc": "ec2:DeleteVpc", "aws:eks/cluster:Cluster": "eks:DeleteCluster",
               "aws:kms/key:Key": "kms:ScheduleKeyDeletion", "aws:sqs/queue:Queue": "sqs:DeleteQueue",
               "aws:s3/bucket:Bucket": "s3:DeleteBucket"}
    assert {f"{action} on {arns[type_]} (as planned)" for type_, action in deletes.items()} <= set(by_arn(old, prod))
    assert f"s3:DeleteBucket on {arns['aws:s3/bucket:Bucket']} (as planned)" in by_arn(everywhere, prod)
