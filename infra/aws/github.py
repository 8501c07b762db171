"""What GitHub Actions assumes to run ``pulumi`` on this stack: roles trusted through GitHub's OIDC provider, so no
workflow holds an AWS key. The deploy role admits only this repository's GitHub environment named like the stack's
environment (where prod's required reviewers apply) and may do what ``pulumi up`` of the stack does, no more
(``deploy_policy.py``); the preview role admits the repository's pull requests, read-only. Both carry the stack's
permissions boundary, and neither can change itself, the boundary or the OIDC trust: the first ``pulumi up``, with an
administrator's credentials, creates them."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws import iam
from infra.aws.deploy_policy import MANAGED_POLICIES, deploy_policy
from infra.kernel.config import GitOpsConfig
from infra.kernel.names import GITHUB_OIDC_AUDIENCE, GITHUB_OIDC_HOST

SESSION_SECONDS = 3600


def deploy_subject(repository: str, environment: str) -> str:
    return f"repo:{repository}:environment:{environment}"


def pull_request_subject(repository: str) -> str:
    return f"repo:{repository}:pull_request"


def provider_arn(account_id: str) -> str:
    return f"arn:aws:iam::{account_id}:oidc-provider/{GITHUB_OIDC_HOST}"


def trust_statement(provider: pulumi.Input[str], subject: str) -> dict:
    """Only a token from GitHub for STS, whose subject is exactly ``subject``, may assume the role."""
    return {"Effect": "Allow", "Principal": {"Federated": provider}, "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {"StringEquals": {f"{GITHUB_OIDC_HOST}:aud": GITHUB_OIDC_AUDIENCE,
                                           f"{GITHUB_OIDC_HOST}:sub": subject}}}


@dataclass(frozen=True)
class GitHubRolesArgs:
    gitops: GitOpsConfig
    environment: str
    role_prefix: str  # <project>-<stack>
    stack: str
    tags: dict[str, str]
    boundary: pulumi.Input[str]  # the permissions boundary of every role the stack creates


class GitHubRoles(pulumi.ComponentResource):
    deploy_role_arn: pulumi.Output[str]
    preview_role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: GitHubRolesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:infra:GitHubRoles", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        gitops = args.gitops
        account = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self)).account_id
        provider: pulumi.Input[str] = gitops.oidc_provider_arn
        depends_on = []
        if not provider:
            created = aws.iam.OpenIdConnectProvider(f"{name}-oidc", url=f"https://{GITHUB_OIDC_HOST}",
                                                    client_id_lists=[GITHUB_OIDC_AUDIENCE], tags=args.tags,
                                                    opts=child)
            # Built from the account, not the resource's arn: the trust policy is known (and checkable) at preview.
            provider = account.apply(provider_arn)
            depends_on = [created]
        roles = {"deploy": (deploy_subject(gitops.repository, args.environment), ()),
                 "preview": (pull_request_subject(gitops.repository), MANAGED_POLICIES["preview"])}
        created_roles = {
            kind: iam.trusted_role(f"{name}-{kind}", iam.policy_document([trust_statement(provider, subject)]),
                                   policies, args.tags, args.boundary,
                                   pulumi.ResourceOptions(parent=self, depends_on=depends_on),
                                   role_name=f"{args.role_prefix}-github-{kind}", max_session_duration=SESSION_SECONDS)
            for kind, (subject, policies) in roles.items()}
        aws.iam.RolePolicy(f"{name}-deploy", role=created_roles["deploy"].id, opts=child, policy=account.apply(
            lambda a: json.dumps(deploy_policy(a, args.role_prefix, args.stack))))
        arns = {kind: role.arn for kind, role in created_roles.items()}
        self.deploy_role_arn, self.preview_role_arn = arns["deploy"], arns["preview"]
        self.register_outputs({"deployRoleArn": self.deploy_role_arn, "previewRoleArn": self.preview_role_arn})
