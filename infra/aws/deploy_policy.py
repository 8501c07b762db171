"""What the pipeline's deploy role may do, and the permissions boundary every role of a stack carries, as plain
policy documents.

The deploy policy grants what ``pulumi up`` of these stacks does: ``DEPLOY_ACTIONS`` maps each AWS resource type
of a stack's plan to the actions that create, change, tag and delete it (``tests/infra/test_deploy_policy.py``
fails on a type without an entry), plus the reads a refresh makes. IAM is the exception: roles may be created and
changed only with the boundary attached, and passed only to the services that run them.

The boundary caps every role the stacks create, the deploy role included: any action except IAM writes that would
lift it. A role under it cannot create or change a role without the same boundary, detach it, edit the boundary
policy, touch the pipeline's own roles or an OIDC provider. Karpenter's instance profiles stay allowed.
"""

from __future__ import annotations

from infra.kernel.settings import STACK_TAG

_TAGS = {"ec2": ["ec2:CreateTags", "ec2:DeleteTags"], "eks": ["eks:TagResource", "eks:UntagResource"]}
DEPLOY_ACTIONS: dict[str, list[str]] = {
    "aws:cloudwatch/eventRule:EventRule": ["events:PutRule", "events:DeleteRule", "events:TagResource",
                                           "events:UntagResource"],
    "aws:cloudwatch/eventTarget:EventTarget": ["events:PutTargets", "events:RemoveTargets"],
    "aws:cloudwatch/logGroup:LogGroup": ["logs:CreateLogGroup", "logs:DeleteLogGroup", "logs:PutRetentionPolicy",
                                         "logs:TagResource", "logs:UntagResource"],
    "aws:ec2/eip:Eip": ["ec2:AllocateAddress", "ec2:ReleaseAddress", "ec2:DisassociateAddress", *_TAGS["ec2"]],
    "aws:ec2/internetGateway:InternetGateway": ["ec2:CreateInternetGateway", "ec2:DeleteInternetGateway",
                                                "ec2:AttachInternetGateway", "ec2:DetachInternetGateway",
                                                *_TAGS["ec2"]],
    "aws:ec2/natGateway:NatGateway": ["ec2:CreateNatGateway", "ec2:DeleteNatGateway", *_TAGS["ec2"]],
    "aws:ec2/routeTable:RouteTable": ["ec2:CreateRouteTable", "ec2:DeleteRouteTable", "ec2:CreateRoute",
                                      "ec2:ReplaceRoute", "ec2:DeleteRoute", *_TAGS["ec2"]],
    "aws:ec2/routeTableAssociation:RouteTableAssociation": ["ec2:AssociateRouteTable", "ec2:DisassociateRouteTable",
                                                            "ec2:ReplaceRouteTableAssociation"],
    "aws:ec2/subnet:Subnet": ["ec2:CreateSubnet", "ec2:DeleteSubnet", "ec2:ModifySubnetAttribute", *_TAGS["ec2"]],
    "aws:ec2/tag:Tag": _TAGS["ec2"],
    "aws:ec2/vpc:Vpc": ["ec2:CreateVpc", "ec2:DeleteVpc", "ec2:ModifyVpcAttribute", *_TAGS["ec2"]],
    "aws:ecr/lifecyclePolicy:LifecyclePolicy": ["ecr:PutLifecyclePolicy", "ecr:DeleteLifecyclePolicy"],
    "aws:ecr/repository:Repository": ["ecr:CreateRepository", "ecr:DeleteRepository",
                                      "ecr:PutImageScanningConfiguration", "ecr:PutImageTagMutability",
                                      "ecr:TagResource", "ecr:UntagResource"],
    "aws:eks/accessEntry:AccessEntry": ["eks:CreateAccessEntry", "eks:UpdateAccessEntry", "eks:DeleteAccessEntry",
                                        *_TAGS["eks"]],
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation": ["eks:AssociateAccessPolicy",
                                                                "eks:DisassociateAccessPolicy"],
    "aws:eks/addon:Addon": ["eks:CreateAddon", "eks:UpdateAddon", "eks:DeleteAddon", *_TAGS["eks"]],
    "aws:eks/cluster:Cluster": ["eks:CreateCluster", "eks:DeleteCluster", "eks:UpdateClusterConfig",
                                "eks:UpdateClusterVersion", "eks:AssociateEncryptionConfig", *_TAGS["eks"]],
    "aws:eks/nodeGroup:NodeGroup": ["eks:CreateNodegroup", "eks:DeleteNodegroup", "eks:UpdateNodegroupConfig",
                                    "eks:UpdateNodegroupVersion", *_TAGS["eks"]],
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": ["eks:CreatePodIdentityAssociation",
                                                              "eks:UpdatePodIdentityAssociation",
                                                              "eks:DeletePodIdentityAssociation", *_TAGS["eks"]],
    "aws:kms/key:Key": ["kms:CreateKey", "kms:EnableKeyRotation", "kms:PutKeyPolicy", "kms:UpdateKeyDescription",
                        "kms:ScheduleKeyDeletion", "kms:TagResource", "kms:UntagResource"],
    "aws:s3/bucket:Bucket": ["s3:CreateBucket", "s3:DeleteBucket", "s3:PutBucketTagging"],
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": ["s3:PutLifecycleConfiguration"],
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls": ["s3:PutBucketOwnershipControls"],
    "aws:s3/bucketPolicy:BucketPolicy": ["s3:PutBucketPolicy", "s3:DeleteBucketPolicy"],
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": ["s3:PutBucketPublicAccessBlock"],
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": [
        "s3:PutEncryptionConfiguration"],
    "aws:s3/bucketVersioning:BucketVersioning": ["s3:PutBucketVersioning"],
    "aws:sqs/queue:Queue": ["sqs:CreateQueue", "sqs:DeleteQueue", "sqs:SetQueueAttributes", "sqs:TagQueue",
                            "sqs:UntagQueue"],
    "aws:sqs/queuePolicy:QueuePolicy": ["sqs:SetQueueAttributes"],
    # IAM: in the statements of deploy_policy, under the boundary condition; the OIDC provider only by the bootstrap.
    "aws:iam/role:Role": [], "aws:iam/rolePolicy:RolePolicy": [],
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": [], "aws:iam/policy:Policy": [],
    "aws:iam/openIdConnectProvider:OpenIdConnectProvider": [],
}
READS = ["ec2:Describe*", "eks:Describe*", "eks:List*", "ecr:Describe*", "ecr:GetLifecyclePolicy",
         "ecr:ListTagsForResource", "events:Describe*", "events:ListTargetsByRule", "events:ListTagsForResource",
         "logs:Describe*", "logs:ListTagsForResource", "logs:ListTagsLogGroup", "kms:Describe*", "kms:GetKeyPolicy",
         "kms:GetKeyRotationStatus", "kms:ListResourceTags", "s3:GetBucket*", "s3:GetLifecycleConfiguration",
         "s3:GetEncryptionConfiguration", "s3:ListBucket", "sqs:GetQueueAttributes", "sqs:ListQueueTags",
         "iam:GetRole", "iam:GetRolePolicy", "iam:ListRolePolicies", "iam:ListAttachedRolePolicies",
         "iam:ListInstanceProfilesForRole", "iam:GetPolicy", "iam:GetPolicyVersion", "iam:ListPolicyVersions",
         "iam:ListRoleTags", "iam:ListPolicyTags", "iam:GetOpenIDConnectProvider", "iam:ListOpenIDConnectProviders",
         "iam:ListOpenIDConnectProviderTags", "sts:GetCallerIdentity"]
ROLE_WRITES = ["iam:CreateRole", "iam:PutRolePolicy", "iam:DeleteRolePolicy", "iam:AttachRolePolicy",
               "iam:DetachRolePolicy", "iam:PutRolePermissionsBoundary"]  # those that take iam:PermissionsBoundary
TAGGED_ROLE_WRITES = ["iam:DeleteRole", "iam:UpdateRole", "iam:UpdateAssumeRolePolicy", "iam:TagRole",
                      "iam:UntagRole"]  # the rest: on the stack's own roles, found by their tag
ROLE_USERS = ["eks.amazonaws.com", "ec2.amazonaws.com", "pods.eks.amazonaws.com"]
SERVICE_LINKED = ["eks.amazonaws.com", "eks-nodegroup.amazonaws.com", "autoscaling.amazonaws.com",
                  "spot.amazonaws.com", "elasticloadbalancing.amazonaws.com"]
ESCALATING = ["iam:CreateRole", "iam:DeleteRole", "iam:UpdateRole", "iam:UpdateAssumeRolePolicy", "iam:PutRolePolicy",
              "iam:DeleteRolePolicy", "iam:AttachRolePolicy", "iam:DetachRolePolicy", "iam:PutRolePermissionsBoundary",
              "iam:DeleteRolePermissionsBoundary", "iam:CreatePolicy", "iam:CreatePolicyVersion",
              "iam:DeletePolicy", "iam:DeletePolicyVersion", "iam:SetDefaultPolicyVersion", "iam:CreateUser",
              "iam:CreateAccessKey", "iam:CreateLoginProfile", "iam:UpdateLoginProfile", "iam:PutUserPolicy",
              "iam:AttachUserPolicy", "iam:PutGroupPolicy", "iam:AttachGroupPolicy", "iam:AddUserToGroup",
              "iam:CreateOpenIDConnectProvider", "iam:UpdateOpenIDConnectProviderThumbprint",
              "iam:AddClientIDToOpenIDConnectProvider", "iam:DeleteOpenIDConnectProvider", "iam:TagRole",
              "iam:UntagRole"]


def boundary_arn(account: str, prefix: str) -> str:
    return f"arn:aws:iam::{account}:policy/{prefix}-boundary"


def pipeline_role_arns(account: str, prefix: str) -> list[str]:
    return [f"arn:aws:iam::{account}:role/{prefix}-github-{kind}" for kind in ("deploy", "preview")]


def deploy_policy(account: str, prefix: str, stack: str) -> dict:
    """The deploy role's inline policy for stack ``stack`` (roles named ``<prefix>-...``) in ``account``."""
    boundary = boundary_arn(account, prefix)
    service_actions = sorted({action for actions in DEPLOY_ACTIONS.values() for action in actions})
    return _document([
        {"Sid": "Reads", "Effect": "Allow", "Action": READS, "Resource": "*"},
        {"Sid": "StackResources", "Effect": "Allow", "Action": service_actions, "Resource": "*"},
        {"Sid": "RolesOnlyWithTheBoundary", "Effect": "Allow", "Action": ROLE_WRITES,
         "Resource": f"arn:aws:iam::{account}:role/*",
         "Condition": {"StringEquals": {"iam:PermissionsBoundary": boundary}}},
        {"Sid": "TheStacksOwnRoles", "Effect": "Allow", "Action": TAGGED_ROLE_WRITES,
         "Resource": f"arn:aws:iam::{account}:role/*",
         "Condition": {"StringEquals": {f"iam:ResourceTag/{STACK_TAG}": stack}}},
        {"Sid": "PassTheStacksRolesToTheirServices", "Effect": "Allow", "Action": "iam:PassRole",
         "Resource": f"arn:aws:iam::{account}:role/*",
         "Condition": {"StringEquals": {"iam:PassedToService": ROLE_USERS,
                                        f"iam:ResourceTag/{STACK_TAG}": stack}}},
        {"Sid": "ServiceLinkedRoles", "Effect": "Allow", "Action": "iam:CreateServiceLinkedRole",
         "Resource": f"arn:aws:iam::{account}:role/aws-service-role/*",
         "Condition": {"StringEquals": {"iam:AWSServiceName": SERVICE_LINKED}}},
        *_guards(account, prefix),
    ])


def boundary_policy(account: str, prefix: str) -> dict:
    """The permissions boundary of every role a stack creates."""
    return _document([
        {"Sid": "AnythingTheRolesOwnPoliciesGrant", "Effect": "Allow", "Action": "*", "Resource": "*"},
        {"Sid": "NoRoleWithoutThisBoundary", "Effect": "Deny", "Action": ROLE_WRITES, "Resource": "*",
         "Condition": {"StringNotEquals": {"iam:PermissionsBoundary": boundary_arn(account, prefix)}}},
        {"Sid": "NoOtherIdentityWrites", "Effect": "Deny",
         "Action": [a for a in ESCALATING if a not in ROLE_WRITES + TAGGED_ROLE_WRITES], "Resource": "*"},
        *_guards(account, prefix),
    ])


def _guards(account: str, prefix: str) -> list[dict]:
    """What neither the deploy role nor any role under the boundary may do: lift the boundary, edit it, or change
    the pipeline's roles (the bootstrap's, an administrator's, alone)."""
    return [
        {"Sid": "KeepTheBoundary", "Effect": "Deny", "Action": ["iam:DeleteRolePermissionsBoundary",
                                                               "iam:CreatePolicyVersion", "iam:DeletePolicyVersion",
                                                               "iam:SetDefaultPolicyVersion", "iam:DeletePolicy"],
         "Resource": "*"},
        {"Sid": "NotThePipelinesRoles", "Effect": "Deny", "Action": ESCALATING,
         "Resource": pipeline_role_arns(account, prefix)},
        {"Sid": "NotTheOidcTrust", "Effect": "Deny",
         "Action": [a for a in ESCALATING if "OpenIDConnectProvider" in a], "Resource": "*"},
    ]


def _document(statements: list[dict]) -> dict:
    return {"Version": "2012-10-17", "Statement": statements}
