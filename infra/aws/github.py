"""What GitHub Actions assumes to run ``pulumi`` on this stack: roles trusted through GitHub's OIDC provider, so no
workflow holds an AWS key. The deploy role admits only this repository's GitHub environment named like the stack's
environment (where prod's required reviewers apply); the preview role admits the repository's pull requests,
read-only."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from spotray.infra.aws import iam
from spotray.infra.kernel.config import GitOpsConfig
from spotray.infra.kernel.names import GITHUB_OIDC_AUDIENCE, GITHUB_OIDC_HOST

DEPLOY_POLICY = "AdministratorAccess"  # pulumi up creates IAM roles, a VPC and EKS: less cannot run it
PREVIEW_POLICY = "ReadOnlyAccess"
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
    tags: dict[str, str]


class GitHubRoles(pulumi.ComponentResource):
    deploy_role_arn: pulumi.Output[str]
    preview_role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: GitHubRolesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:infra:GitHubRoles", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        gitops = args.gitops
        provider: pulumi.Input[str] = gitops.oidc_provider_arn
        depends_on = []
        if not provider:
            created = aws.iam.OpenIdConnectProvider(f"{name}-oidc", url=f"https://{GITHUB_OIDC_HOST}",
                                                    client_id_lists=[GITHUB_OIDC_AUDIENCE], tags=args.tags,
                                                    opts=child)
            # Built from the account, not the resource's arn: the trust policy is known (and checkable) at preview.
            provider = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self)).account_id.apply(
                provider_arn)
            depends_on = [created]
        roles = {"deploy": (deploy_subject(gitops.repository, args.environment), DEPLOY_POLICY),
                 "preview": (pull_request_subject(gitops.repository), PREVIEW_POLICY)}
        arns = {
            kind: iam.trusted_role(f"{name}-{kind}", iam.policy_document([trust_statement(provider, subject)]),
                                   [policy], args.tags, pulumi.ResourceOptions(parent=self, depends_on=depends_on),
                                   role_name=f"{args.role_prefix}-github-{kind}",
                                   max_session_duration=SESSION_SECONDS).arn
            for kind, (subject, policy) in roles.items()}
        self.deploy_role_arn, self.preview_role_arn = arns["deploy"], arns["preview"]
        self.register_outputs({"deployRoleArn": self.deploy_role_arn, "previewRoleArn": self.preview_role_arn})
