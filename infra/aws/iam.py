"""IAM roles the components share: for an AWS service, and for pods through EKS Pod Identity."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from infra.aws.deploy_policy import boundary_policy, managed_policy_arn
from infra.kernel.settings import STACK_TAG

POD_IDENTITY_PRINCIPAL = "pods.eks.amazonaws.com"


def role(name: str, service: str, managed_policies: Sequence[str], tags: dict[str, str], boundary: pulumi.Input[str],
         opts: pulumi.ResourceOptions) -> aws.iam.Role:
    """A role ``service`` (e.g. ec2.amazonaws.com) assumes, with AWS-managed policies attached by name (those of
    ``deploy_policy.MANAGED_POLICIES``: the boundary refuses any other)."""
    actions = ["sts:AssumeRole", "sts:TagSession"] if service == POD_IDENTITY_PRINCIPAL else ["sts:AssumeRole"]
    assume = {"Version": "2012-10-17",
              "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": actions}]}
    return trusted_role(name, json.dumps(assume), managed_policies, tags, boundary, opts)


def trusted_role(name: str, assume_role_policy: pulumi.Input[str], managed_policies: Sequence[str],
                 tags: dict[str, str], boundary: pulumi.Input[str], opts: pulumi.ResourceOptions,
                 role_name: str | None = None, max_session_duration: int | None = None) -> aws.iam.Role:
    """A role with the trust policy ``assume_role_policy``, AWS-managed policies attached by name, and the stack's
    permissions boundary (``deploy_policy.boundary_policy``), which every role of a stack carries."""
    created = aws.iam.Role(name, name=role_name, assume_role_policy=assume_role_policy,
                           max_session_duration=max_session_duration, permissions_boundary=boundary, tags=tags,
                           opts=opts)
    for policy in managed_policies:
        aws.iam.RolePolicyAttachment(f"{name}-{policy.rsplit('/', 1)[-1]}", role=created.name,
                                     policy_arn=managed_policy_arn(policy), opts=opts)
    return created


def pod_role(name: str, cluster_name: pulumi.Input[str], namespace: str, service_account: str,
             policy: pulumi.Input[str] | None, tags: dict[str, str], boundary: pulumi.Input[str],
             opts: pulumi.ResourceOptions, managed_policies: Sequence[str] = ()) -> aws.iam.Role:
    """A role the pods of one service account assume through EKS Pod Identity, with an inline ``policy``."""
    created = role(name, POD_IDENTITY_PRINCIPAL, managed_policies, tags, boundary, opts)
    if policy is not None:
        aws.iam.RolePolicy(name, role=created.id, policy=policy, opts=opts)
    aws.eks.PodIdentityAssociation(name, cluster_name=cluster_name, namespace=namespace,
                                   service_account=service_account, role_arn=created.arn, tags=tags, opts=opts)
    return created


def policy_document(statements: list[dict]) -> pulumi.Output[str]:
    """An IAM policy; statements may hold Outputs (ARNs of resources being created)."""
    return pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": statements})


class PermissionsBoundary(pulumi.ComponentResource):
    """The stack's permissions boundary (``deploy_policy.boundary_policy``), before any role: each carries it."""

    arn: pulumi.Output[str]

    def __init__(self, name: str, prefix: str, tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:infra:PermissionsBoundary", name, None, opts)
        account = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self)).account_id
        stack = tags[STACK_TAG]  # whose tag the boundary's roles may touch and set
        policy = aws.iam.Policy(name, name=f"{prefix}-boundary", tags=tags,
                                description="spotray: the most any role of this stack may do",
                                policy=account.apply(lambda a: json.dumps(boundary_policy(a, prefix, stack))),
                                opts=pulumi.ResourceOptions(parent=self))
        self.arn = policy.arn
        self.register_outputs({"arn": self.arn})
