"""What the pipeline's deploy role may do, and the permissions boundary every role of a stack carries, as plain
policy documents.

The deploy policy grants what ``pulumi up`` of these stacks does, on the stack's own resources: ``DEPLOY_ACTIONS``
maps each AWS resource type of a stack's plan to the actions that create, change, tag and delete it
(``tests/infra/test_deploy_policy.py`` fails on a type without an entry), plus the reads a refresh makes. A resource
is the stack's by its name where its ARN holds one (the EKS cluster and what hangs off it, the control-plane log
group, the image repository, the bucket), else by the stack tag ``STACK_TAG``: created only with it
(``aws:RequestTag``; EC2 tags a new resource in the call that creates it, ``ec2:CreateAction``), changed only where
it carries it (``aws:ResourceTag``). IAM is the exception: roles may be created and changed only with the boundary
attached and the stack's tag, hold only the managed policies the stacks use (``MANAGED_POLICIES``), and be passed
only to the services that run them. ``tests/infra/test_deploy_isolation.py`` and ``test_deploy_sufficiency.py``
evaluate both documents against every stack's plan.

The boundary caps every role the stacks create, the deploy role included: any action except IAM writes that would
lift it, anything on a resource tagged for another stack or tagging one for it, and attaching a managed policy other
than ``MANAGED_POLICIES`` and the stack's own (path ``/<project>-<stack>/``). A role under it cannot create or change
a role without the same boundary, detach it, edit the boundary policy, touch the pipeline's own roles or an OIDC
provider. Karpenter's instance profiles stay allowed.
"""

from __future__ import annotations

from infra.kernel.names import DISCOVERY_TAG
from infra.kernel.settings import STACK_TAG

# The AWS managed policies the stacks attach, by the role that holds them: the only ones a role of a stack may get,
# besides the stack's own.
MANAGED_POLICIES: dict[str, tuple[str, ...]] = {
    "control-plane": ("AmazonEKSClusterPolicy",),
    "node": ("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryReadOnly",
             "AmazonSSMManagedInstanceCore"),
    "ebs-csi": ("service-role/AmazonEBSCSIDriverPolicy",),
    "preview": ("ReadOnlyAccess",),
}
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
    # CreateGrant: EKS takes a grant on the key that encrypts the cluster's secrets, as the caller.
    "aws:kms/key:Key": ["kms:CreateKey", "kms:EnableKeyRotation", "kms:PutKeyPolicy", "kms:UpdateKeyDescription",
                        "kms:ScheduleKeyDeletion", "kms:TagResource", "kms:UntagResource", "kms:CreateGrant"],
    # The object deletes: a bucket without protect is emptied before it is deleted (force_destroy).
    "aws:s3/bucket:Bucket": ["s3:CreateBucket", "s3:DeleteBucket", "s3:PutBucketTagging", "s3:DeleteObject",
                             "s3:DeleteObjectVersion"],
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
    # IAM: in the statements of deploy_policy of their own; the boundary and the OIDC provider only by the bootstrap.
    "aws:iam/role:Role": ["iam:CreateRole", "iam:TagRole", "iam:UntagRole", "iam:UpdateRole",
                          "iam:UpdateAssumeRolePolicy", "iam:PutRolePermissionsBoundary", "iam:DeleteRole",
                          "iam:PassRole"],
    "aws:iam/rolePolicy:RolePolicy": ["iam:PutRolePolicy", "iam:DeleteRolePolicy"],
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": ["iam:AttachRolePolicy", "iam:DetachRolePolicy"],
    "aws:iam/policy:Policy": [], "aws:iam/openIdConnectProvider:OpenIdConnectProvider": [],
}
# The services whose ARNs name the stack's resources (``stack_arns``), and those whose resources are the stack's by
# its tag.
NAMED_SERVICES = ("eks", "logs", "ecr", "s3")
TAGGED_SERVICES = ("ec2", "events", "kms", "sqs")
# The calls that create a resource: they carry the tags it gets (aws:RequestTag); it has none yet.
CREATES = ["ec2:AllocateAddress", "ec2:CreateInternetGateway", "ec2:CreateNatGateway", "ec2:CreateRouteTable",
           "ec2:CreateSubnet", "ec2:CreateVpc", "ecr:CreateRepository", "eks:CreateAccessEntry", "eks:CreateAddon",
           "eks:CreateCluster", "eks:CreateNodegroup", "eks:CreatePodIdentityAssociation", "events:PutRule",
           "iam:CreateRole", "kms:CreateKey", "logs:CreateLogGroup", "s3:CreateBucket", "sqs:CreateQueue"]
# Allowed by the stack's tag they ask for: the creates of the tagged services with the taggings that go with them,
# and CreateCluster (IAM sees no ARN for it: the cluster does not exist yet).
CREATED_TAGGED = [*(a for a in CREATES if a.split(":")[0] in TAGGED_SERVICES), "eks:CreateCluster",
                  "events:TagResource", "kms:TagResource", "sqs:TagQueue"]
IMAGE_PUSH = ["ecr:BatchCheckLayerAvailability", "ecr:InitiateLayerUpload", "ecr:UploadLayerPart",
              "ecr:CompleteLayerUpload", "ecr:PutImage"]  # make image, in the deploy workflow
# What a refresh reads: every setting of the types the stacks create, on any resource; no log events, queue messages
# or image layers.
READS = ["ec2:Describe*", "ec2:List*", "ec2:GetSecurityGroupsForVpc", "ec2:GetRouteServerPropagations",
         "ec2:GetVpcResourcesBlockingEncryptionEnforcement", "eks:Describe*", "eks:List*", "ecr:Describe*",
         "ecr:List*", "ecr:GetLifecyclePolicy*", "ecr:GetRepositoryPolicy", "ecr:GetImageCopyStatus",
         "ecr:BatchGetRepositoryScanningConfiguration", "ecr:GetAuthorizationToken", "events:Describe*",
         "events:List*", "logs:Describe*", "logs:List*", "logs:GetDataProtectionPolicy", "logs:GetTransformer",
         "kms:Describe*", "kms:List*", "kms:GetKeyPolicy", "kms:GetKeyRotationStatus", "kms:GetPublicKey",
         "s3:GetBucket*", "s3:Get*Configuration", "s3:List*", "sqs:Get*", "sqs:List*", "iam:Get*", "iam:List*",
         "sts:GetCallerIdentity"]
ROLE_WRITES = ["iam:CreateRole", "iam:PutRolePolicy", "iam:DeleteRolePolicy", "iam:AttachRolePolicy",
               "iam:DetachRolePolicy", "iam:PutRolePermissionsBoundary"]  # those that take iam:PermissionsBoundary
TAGGED_ROLE_WRITES = ["iam:DeleteRole", "iam:UpdateRole", "iam:UpdateAssumeRolePolicy", "iam:TagRole",
                      "iam:UntagRole"]  # the rest: on the stack's own roles, found by their tag
# On a role that is the stack's: tagged for it and under its boundary.
OWN_ROLE_WRITES = ["iam:DeleteRole", "iam:UpdateRole", "iam:UpdateAssumeRolePolicy", "iam:PutRolePolicy",
                   "iam:DeleteRolePolicy", "iam:DetachRolePolicy", "iam:PutRolePermissionsBoundary"]
# Pulumi names a role <component>-<role>-<random>: a role not yet tagged may be tagged for the stack only under these
# names (IAM cannot tell a role being created from one that lacks the tag).
ROLE_COMPONENTS = ("cluster", "core", "karpenter", "storage")
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


def managed_policy_arn(name: str) -> str:
    return f"arn:aws:iam::aws:policy/{name}"


def boundary_arn(account: str, prefix: str) -> str:
    return f"arn:aws:iam::{account}:policy/{prefix}-boundary"


def pipeline_role_arns(account: str, prefix: str) -> list[str]:
    return [f"arn:aws:iam::{account}:role/{prefix}-github-{kind}" for kind in ("deploy", "preview")]


def attachable_policy_arns(account: str, prefix: str) -> list[str]:
    """``MANAGED_POLICIES``, and the stack's own managed policies: under the path ``/<prefix>/``."""
    return [*(managed_policy_arn(p) for ps in MANAGED_POLICIES.values() for p in ps),
            f"arn:aws:iam::{account}:policy/{prefix}/*"]


def stack_arns(account: str, prefix: str, stack: str) -> list[str]:
    """The ARNs that name the stack's resources (``prefix`` is ``<project>-<stack>``): its EKS cluster and what hangs
    off it, its control-plane log group, its image repository (``<project>/<stack>/...``) and its bucket."""
    project = prefix.removesuffix(f"-{stack}")
    return [f"arn:aws:eks:*:{account}:cluster/{prefix}", f"arn:aws:eks:*:{account}:*/{prefix}/*",
            f"arn:aws:logs:*:{account}:log-group:/aws/eks/{prefix}/*",
            f"arn:aws:ecr:*:{account}:repository/{project}/{stack}/*", f"arn:aws:s3:::{prefix}",
            f"arn:aws:s3:::{prefix}/*"]


def deploy_policy(account: str, prefix: str, stack: str) -> dict:
    """The deploy role's inline policy for stack ``stack`` (resources named ``<prefix>...``) in ``account``."""
    actions = sorted({action for actions in DEPLOY_ACTIONS.values() for action in actions})
    named = [a for a in actions if _service(a) in NAMED_SERVICES and a not in CREATED_TAGGED]
    tagged = [a for a in actions if _service(a) in TAGGED_SERVICES]
    requested = {f"aws:RequestTag/{STACK_TAG}": stack}
    return _document([
        {"Sid": "Reads", "Effect": "Allow", "Action": READS, "Resource": "*"},
        {"Sid": "TheStacksNamedResources", "Effect": "Allow", "Action": named + IMAGE_PUSH,
         "Resource": stack_arns(account, prefix, stack)},
        {"Sid": "TheStacksTaggedResources", "Effect": "Allow", "Action": tagged, "Resource": "*",
         "Condition": {"StringEquals": {f"aws:ResourceTag/{STACK_TAG}": stack}}},
        {"Sid": "CreateForTheStack", "Effect": "Allow", "Action": CREATED_TAGGED, "Resource": "*",
         "Condition": {"StringEquals": requested, "Null": {f"aws:ResourceTag/{STACK_TAG}": "true"}}},
        {"Sid": "TagOnCreateForTheStack", "Effect": "Allow", "Action": "ec2:CreateTags", "Resource": "*",
         "Condition": {"StringEquals": {"ec2:CreateAction": [a.removeprefix("ec2:") for a in CREATED_TAGGED
                                                             if a.startswith("ec2:")], **requested}}},
        # Karpenter's discovery tag, on the security group EKS creates for the cluster (and tags as the cluster's).
        {"Sid": "TheClustersSecurityGroup", "Effect": "Allow", "Action": _TAGS["ec2"],
         "Resource": f"arn:aws:ec2:*:{account}:security-group/*",
         "Condition": {"StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{prefix}": "owned"},
                       "ForAllValues:StringEquals": {"aws:TagKeys": [DISCOVERY_TAG]}}},
        *_role_statements(account, prefix, stack),
        *_guards(account, prefix),
    ])


def _role_statements(account: str, prefix: str, stack: str) -> list[dict]:
    """Roles: created only with the boundary and the stack's tag; changed, given managed policies and passed only
    when they are the stack's (tagged, with its boundary)."""
    roles = f"arn:aws:iam::{account}:role/*"
    own = {"iam:PermissionsBoundary": boundary_arn(account, prefix), f"iam:ResourceTag/{STACK_TAG}": stack}
    requested = {f"aws:RequestTag/{STACK_TAG}": stack}
    return [
        {"Sid": "RolesOnlyWithTheBoundary", "Effect": "Allow", "Action": "iam:CreateRole", "Resource": roles,
         "Condition": {"StringEquals": {"iam:PermissionsBoundary": boundary_arn(account, prefix), **requested}}},
        {"Sid": "TagNewRoles", "Effect": "Allow", "Action": "iam:TagRole",
         "Resource": [f"arn:aws:iam::{account}:role/{component}-*" for component in ROLE_COMPONENTS],
         "Condition": {"StringEquals": requested, "Null": {f"iam:ResourceTag/{STACK_TAG}": "true"}}},
        {"Sid": "TheStacksOwnRoles", "Effect": "Allow", "Action": OWN_ROLE_WRITES, "Resource": roles,
         "Condition": {"StringEquals": own}},
        {"Sid": "OnlyTheManagedPoliciesTheStacksUse", "Effect": "Allow", "Action": "iam:AttachRolePolicy",
         "Resource": roles,
         "Condition": {"StringEquals": own, "ArnLike": {"iam:PolicyARN": attachable_policy_arns(account, prefix)}}},
        {"Sid": "RetagTheStacksOwnRoles", "Effect": "Allow", "Action": ["iam:TagRole", "iam:UntagRole"],
         "Resource": roles, "Condition": {"StringEquals": {f"iam:ResourceTag/{STACK_TAG}": stack}}},
        {"Sid": "PassTheStacksRolesToTheirServices", "Effect": "Allow", "Action": "iam:PassRole", "Resource": roles,
         "Condition": {"StringEquals": {"iam:PassedToService": ROLE_USERS, f"iam:ResourceTag/{STACK_TAG}": stack}}},
        {"Sid": "ServiceLinkedRoles", "Effect": "Allow", "Action": "iam:CreateServiceLinkedRole",
         "Resource": f"arn:aws:iam::{account}:role/aws-service-role/*",
         "Condition": {"StringEquals": {"iam:AWSServiceName": SERVICE_LINKED}}},
    ]


def boundary_policy(account: str, prefix: str, stack: str) -> dict:
    """The permissions boundary of every role a stack creates."""
    return _document([
        {"Sid": "AnythingTheRolesOwnPoliciesGrant", "Effect": "Allow", "Action": "*", "Resource": "*"},
        {"Sid": "NoRoleWithoutThisBoundary", "Effect": "Deny", "Action": ROLE_WRITES, "Resource": "*",
         "Condition": {"StringNotEquals": {"iam:PermissionsBoundary": boundary_arn(account, prefix)}}},
        {"Sid": "NoOtherManagedPolicy", "Effect": "Deny", "Action": "iam:AttachRolePolicy", "Resource": "*",
         "Condition": {"ArnNotLike": {"iam:PolicyARN": attachable_policy_arns(account, prefix)}}},
        {"Sid": "NoOtherIdentityWrites", "Effect": "Deny",
         "Action": [a for a in ESCALATING if a not in ROLE_WRITES + TAGGED_ROLE_WRITES], "Resource": "*"},
        *_guards(account, prefix),
        *_other_stacks(stack),
    ])


def _other_stacks(stack: str) -> list[dict]:
    """Nothing on a resource tagged for another stack, and nothing that tags one for another stack."""
    return [{"Sid": f"Not{sid}", "Effect": "Deny", "Action": "*", "Resource": "*",
             "Condition": {"StringNotEquals": {key: stack}, "Null": {key: "false"}}}
            for sid, key in (("AnotherStacksResources", f"aws:ResourceTag/{STACK_TAG}"),
                             ("ForAnotherStack", f"aws:RequestTag/{STACK_TAG}"))]


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


def _service(action: str) -> str:
    return action.split(":", 1)[0]


def _document(statements: list[dict]) -> dict:
    return {"Version": "2012-10-17", "Statement": statements}
