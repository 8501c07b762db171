"""A planned stack's AWS resources as IAM sees them, the actions policy-sentry's offline database lists for them,
and the stack's deploy role as its plan writes it.

Each planned resource becomes a ``Target``: the ARN an action on it names (its parent's for what lives on another
resource: a bucket's settings, a role's policies, a rule's targets, a route table's associations), policy-sentry's
name for that resource type, and the tags IAM reads from it. Names Pulumi generates (``<logical name>-<random>``) and
the IDs AWS assigns get a fixed random-looking suffix per stack. The requests built here carry what AWS puts in the
request context: the resource's tags (S3 puts none: attribute-based access is off by default on a bucket), a role's
boundary, and the tags a request asks for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache

from policy_sentry.querying.actions import (
    get_actions_at_access_level_that_support_wildcard_arns_only,
    get_actions_with_arn_type_and_access_level,
    get_service_prefix_data,
)
from policyuniverse.arn import ARN  # type: ignore[import-untyped]

from infra.aws.deploy_policy import ROLE_USERS, attachable_policy_arns, boundary_arn
from infra.kernel.config import StackConfig
from infra.plan import Plan, PlannedResource
from tests.infra.iam_eval import Request, allowed

AWS_STACKS = ("dev", "staging", "prod")
ACCOUNT = "123456789012"  # the mocks' caller identity
MUTATING = ("Write", "Permissions management", "Tagging")
READING = ("Read", "List")


@dataclass(frozen=True)
class Target:
    type: str  # the planned resource's Pulumi type
    name: str  # its logical name
    arn: str
    resource_type: str  # policy-sentry's name for the type of the resource ``arn`` names
    tags: Mapping[str, str]
    boundary: str | None = None  # a role's permissions boundary

    @property
    def service(self) -> str:
        return ARN(self.arn).tech

    @property
    def tags_in_context(self) -> bool:
        return self.service != "s3"  # S3 knows a bucket by its name only

    def context(self) -> dict[str, str]:
        """What IAM knows of the resource when an action names it."""
        context = {f"aws:ResourceTag/{k}": v for k, v in self.tags.items()} if self.tags_in_context else {}
        if self.service == "iam":
            context |= {f"iam:ResourceTag/{k}": v for k, v in self.tags.items()}
        if self.boundary:
            context["iam:PermissionsBoundary"] = self.boundary
        return context


def requested(tags: Mapping[str, str]) -> dict[str, str | list[str]]:
    """The request context of a call that asks for ``tags``: a create, or a tagging."""
    return {**{f"aws:RequestTag/{k}": v for k, v in tags.items()}, "aws:TagKeys": sorted(tags)}


def _suffix(cfg: StackConfig, r: PlannedResource, length: int) -> str:
    return hashlib.sha256(f"{cfg.stack}/{r.type}/{r.name}".encode()).hexdigest()[:length]


def _generated_name(cfg: StackConfig, r: PlannedResource) -> str:
    return r.inputs.get("name") or f"{r.name}-{_suffix(cfg, r, 7)}"


def _arn(cfg: StackConfig, service: str, resource: str) -> str:
    return f"arn:aws:{service}:{cfg.region}:{ACCOUNT}:{resource}"


def _ec2(kind: str, prefix: str) -> Callable[[StackConfig, PlannedResource], str]:
    return lambda cfg, r: _arn(cfg, "ec2", f"{kind}/{prefix}-{_suffix(cfg, r, 17)}")


def _eks(kind: str, name: Callable[[PlannedResource], list[str]]) -> Callable[[StackConfig, PlannedResource], str]:
    """An EKS ARN: the kind, the cluster's name, what ``name`` takes from the inputs, an ID."""
    def arn(cfg: StackConfig, r: PlannedResource) -> str:
        return _arn(cfg, "eks", "/".join([kind, r.inputs["clusterName"], *name(r), _suffix(cfg, r, 8)]))
    return arn


def _principal(r: PlannedResource) -> list[str]:
    """An access entry's identity type, account and name (the mocks' role ARNs end in the role's name)."""
    return ["role", ACCOUNT, r.inputs["principalArn"].rsplit(":", 1)[-1].rsplit("/", 1)[-1]]


_IAM = f"arn:aws:iam::{ACCOUNT}"
# Pulumi type -> (policy-sentry's resource type, the resource's ARN)
RESOURCES: dict[str, tuple[str, Callable[[StackConfig, PlannedResource], str]]] = {
    "aws:cloudwatch/eventRule:EventRule": ("rule-on-default-event-bus",
                                           lambda cfg, r: _arn(cfg, "events", f"rule/{_generated_name(cfg, r)}")),
    "aws:cloudwatch/logGroup:LogGroup": ("log-group",
                                         lambda cfg, r: _arn(cfg, "logs", f"log-group:{r.inputs['name']}")),
    "aws:ec2/eip:Eip": ("elastic-ip", _ec2("elastic-ip", "eipalloc")),
    "aws:ec2/internetGateway:InternetGateway": ("internet-gateway", _ec2("internet-gateway", "igw")),
    "aws:ec2/natGateway:NatGateway": ("natgateway", _ec2("natgateway", "nat")),
    "aws:ec2/routeTable:RouteTable": ("route-table", _ec2("route-table", "rtb")),
    "aws:ec2/subnet:Subnet": ("subnet", _ec2("subnet", "subnet")),
    "aws:ec2/vpc:Vpc": ("vpc", _ec2("vpc", "vpc")),
    "aws:ec2/tag:Tag": ("security-group", _ec2("security-group", "sg")),  # the cluster's, which EKS creates
    "aws:ecr/repository:Repository": ("repository",
                                      lambda cfg, r: _arn(cfg, "ecr", f"repository/{r.inputs['name']}")),
    "aws:eks/cluster:Cluster": ("cluster", lambda cfg, r: _arn(cfg, "eks", f"cluster/{r.inputs['name']}")),
    "aws:eks/nodeGroup:NodeGroup": ("nodegroup", _eks("nodegroup", lambda r: [r.inputs["nodeGroupName"]])),
    "aws:eks/addon:Addon": ("addon", _eks("addon", lambda r: [r.inputs["addonName"]])),
    "aws:eks/accessEntry:AccessEntry": ("access-entry", _eks("access-entry", _principal)),
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": ("podidentityassociation",
                                                              _eks("podidentityassociation", lambda r: [])),
    "aws:kms/key:Key": ("key", lambda cfg, r: _arn(cfg, "kms", f"key/{_suffix(cfg, r, 32)}")),
    "aws:s3/bucket:Bucket": ("bucket", lambda cfg, r: f"arn:aws:s3:::{r.inputs['bucket']}"),
    "aws:sqs/queue:Queue": ("queue", lambda cfg, r: _arn(cfg, "sqs", _generated_name(cfg, r))),
    "aws:iam/role:Role": ("role", lambda cfg, r: f"{_IAM}:role/{_generated_name(cfg, r)}"),
    "aws:iam/policy:Policy": ("policy", lambda cfg, r: f"{_IAM}:policy/{r.inputs['name']}"),
    "aws:iam/openIdConnectProvider:OpenIdConnectProvider": (
        "oidc-provider", lambda cfg, r: f"{_IAM}:oidc-provider/{r.inputs['url'].removeprefix('https://')}"),
}
_S3_SETTINGS = ("BucketLifecycleConfiguration", "BucketOwnershipControls", "BucketPolicy", "BucketPublicAccessBlock",
                "BucketServerSideEncryptionConfiguration", "BucketVersioning")
# Pulumi type -> (the input that names the parent, the parent's type): what lives on another resource.
PARENTS: dict[str, tuple[str, str]] = {
    "aws:cloudwatch/eventTarget:EventTarget": ("rule", "aws:cloudwatch/eventRule:EventRule"),
    "aws:ec2/routeTableAssociation:RouteTableAssociation": ("routeTableId", "aws:ec2/routeTable:RouteTable"),
    "aws:ecr/lifecyclePolicy:LifecyclePolicy": ("repository", "aws:ecr/repository:Repository"),
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation": ("principalArn", "aws:eks/accessEntry:AccessEntry"),
    "aws:sqs/queuePolicy:QueuePolicy": ("queueUrl", "aws:sqs/queue:Queue"),
    "aws:iam/rolePolicy:RolePolicy": ("role", "aws:iam/role:Role"),
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": ("role", "aws:iam/role:Role"),
    **{f"aws:s3/{kind[0].lower()}{kind[1:]}:{kind}": ("bucket", "aws:s3/bucket:Bucket") for kind in _S3_SETTINGS},
}


def targets(cfg: StackConfig, plan: Plan) -> list[Target]:
    """Every AWS resource of ``plan`` as a ``Target``."""
    return [target(cfg, plan, r) for r in plan.resources if r.type.startswith("aws:")]


def target(cfg: StackConfig, plan: Plan, r: PlannedResource) -> Target:
    """The planned resource ``r`` as IAM sees it."""
    if r.type in PARENTS:
        key, parent_type = PARENTS[r.type]
        parent = target(cfg, plan, _parent(plan, r.inputs[key], parent_type))
        return Target(r.type, r.name, parent.arn, parent.resource_type, parent.tags, parent.boundary)
    resource_type, arn = RESOURCES[r.type]
    tags = r.inputs.get("tags") or {}
    if r.type == "aws:ec2/tag:Tag":
        tags = {f"kubernetes.io/cluster/{cfg.cluster_name}": "owned"}  # what EKS tags its cluster security group with
    boundary = boundary_arn(ACCOUNT, cfg.cluster_name) if r.type == "aws:iam/role:Role" else None
    return Target(r.type, r.name, arn(cfg, r), resource_type, tags, boundary)


def _parent(plan: Plan, reference: str, parent_type: str) -> PlannedResource:
    """The resource of ``parent_type`` that ``reference`` (its id, name, URL or principal, as the mocks make them)
    points at."""
    def named_by(p: PlannedResource) -> bool:
        names = {f"{p.name}-id", p.inputs.get("name", p.name), p.inputs.get("principalArn")}
        return reference in names or reference.endswith(f"/{p.name}")
    (parent,) = [p for p in plan.of_type(parent_type) if named_by(p)]
    return parent


@cache
def actions_on(service: str, resource_type: str, levels: tuple[str, ...]) -> tuple[str, ...]:
    """The actions of ``service`` at the access ``levels`` that name a resource of ``resource_type``."""
    return tuple(sorted({a for level in levels
                         for a in get_actions_with_arn_type_and_access_level(service, resource_type, level)}))


@cache
def resourceless(service: str, levels: tuple[str, ...]) -> tuple[str, ...]:
    """The actions of ``service`` at the access ``levels`` that name no resource (IAM sees ``*``)."""
    return tuple(sorted({a for level in levels
                         for a in get_actions_at_access_level_that_support_wildcard_arns_only(service, level)}))


@cache
def resource_types(action: str) -> frozenset[str]:
    """policy-sentry's resource types of ``action`` (empty: it names none)."""
    service, name = action.split(":")
    privilege = get_service_prefix_data(service)["privileges_lower_name"][name.lower()]
    types = get_service_prefix_data(service)["privileges"][privilege]["resource_types"]
    return frozenset(t for t in types if t)


def access_level(action: str) -> str:
    service, name = action.split(":")
    data = get_service_prefix_data(service)
    return data["privileges"][data["privileges_lower_name"][name.lower()]]["access_level"]


def resource_of(action: str, target: Target) -> str:
    """What ``action`` on ``target`` names: its ARN, an object in it (a bucket's object actions), or ``*``."""
    types = resource_types(action)
    if not types:
        return "*"
    if target.resource_type not in types and "object" in types:
        return f"{target.arn}/checkpoints/step-1"
    return target.arn


@dataclass(frozen=True)
class DeployRole:
    stack: str
    prefix: str  # <project>-<stack>
    identity: list[dict]
    boundary: dict

    def may(self, action: str, target: Target, context: dict) -> bool:
        """Whether the role may do ``action`` on ``target`` with ``context`` and the keys a caller chooses: a
        managed policy it may attach, a service it may pass a role to, its own boundary for a role it creates or
        re-bounds."""
        chosen = {"iam:PolicyARN": attachable_policy_arns(ACCOUNT, self.prefix)[0],
                  "iam:PassedToService": ROLE_USERS[-1]}
        if action in ("iam:CreateRole", "iam:PutRolePermissionsBoundary"):
            chosen["iam:PermissionsBoundary"] = boundary_arn(ACCOUNT, self.prefix)
        request = Request(action, resource_of(action, target), {**context, **chosen})
        return allowed(request, self.identity, self.boundary)


def deploy_role(stack_plans, stack: str) -> DeployRole:
    """The deploy role of ``stack`` as its plan writes it: inline policy and permissions boundary."""
    cfg, plan = stack_plans[stack]
    inline = [json.loads(p.inputs["policy"]) for p in plan.of_type("aws:iam/rolePolicy:RolePolicy")
              if p.name.startswith("github-deploy")]
    (boundary,) = plan.of_type("aws:iam/policy:Policy")
    return DeployRole(stack, cfg.cluster_name, inline, json.loads(boundary.inputs["policy"]))
