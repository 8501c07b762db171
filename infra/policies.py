"""The stack's invariants as predicates over resources, written once and enforced twice: by the CrossGuard
policy pack in ``policy/`` (``pulumi preview --policy-pack policy/``) and by pytest over the mocked graph.

A predicate takes every resource of the stack (type token, camelCase inputs as the engine sees them, and the
protect / retain-on-delete options) and returns one message per violation."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from infra.kernel.config import NAMESPACE
from infra.kernel.instances import GPU_FAMILIES
from infra.kernel.names import (
    COMPONENT_LABEL,
    GITHUB_OIDC_AUDIENCE,
    GITHUB_OIDC_HOST,
    GPU_TAINT,
    ON_DEMAND_FALLBACK_LABEL,
    POOL_LABEL,
    WARM_SPARE_COMPONENT,
)

NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
RAY_PORTS = (6379, 8265, 10001)  # GCS, dashboard/job API, Ray client: never on the internet
OPEN_CIDRS = ("0.0.0.0/0", "::/0")
STATEFUL = ("aws:s3/bucket:Bucket", "aws:eks/cluster:Cluster", "aws:kms/key:Key", "aws:ecr/repository:Repository")
# The AWS types this program creates that take tags (tests check the list against the SDK's signatures).
TAGGABLE = (
    "aws:ec2/vpc:Vpc", "aws:ec2/internetGateway:InternetGateway", "aws:ec2/routeTable:RouteTable",
    "aws:ec2/subnet:Subnet", "aws:ec2/eip:Eip", "aws:ec2/natGateway:NatGateway", "aws:kms/key:Key",
    "aws:iam/role:Role", "aws:cloudwatch/logGroup:LogGroup", "aws:eks/cluster:Cluster",
    "aws:iam/openIdConnectProvider:OpenIdConnectProvider", "aws:eks/accessEntry:AccessEntry",
    "aws:eks/nodeGroup:NodeGroup", "aws:eks/addon:Addon", "aws:eks/podIdentityAssociation:PodIdentityAssociation",
    "aws:sqs/queue:Queue", "aws:cloudwatch/eventRule:EventRule", "aws:ecr/repository:Repository",
    "aws:s3/bucket:Bucket", "aws:iam/policy:Policy",
)


@dataclass(frozen=True)
class Resource:
    type: str
    name: str
    props: dict
    protect: bool = False
    retain_on_delete: bool = False


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    check: Callable[[list[Resource], str], list[str]]  # (resources, environment) -> violations


def _of(resources: list[Resource], type_: str) -> list[Resource]:
    return [r for r in resources if r.type == type_]


def _requirement(pool: Resource, key: str) -> list[str]:
    spec = pool.props.get("spec", {}).get("template", {}).get("spec", {})
    return next((r.get("values", []) for r in spec.get("requirements", []) if r.get("key") == key), [])


def _is_gpu_pool(pool: Resource) -> bool:
    families = _requirement(pool, "karpenter.k8s.aws/instance-family")
    return any(f in GPU_FAMILIES for f in families) or not families


def gpu_pools_are_tainted_spot(resources: list[Resource], environment: str) -> list[str]:
    found = []
    for pool in filter(_is_gpu_pool, _of(resources, NODE_POOL)):
        taints = pool.props.get("spec", {}).get("template", {}).get("spec", {}).get("taints", [])
        if not any(t.get("key") == GPU_TAINT["key"] and t.get("effect") == "NoSchedule" for t in taints):
            found.append(f"NodePool {pool.name}: GPU nodes without the nvidia.com/gpu NoSchedule taint")
        if "spot" not in _requirement(pool, "karpenter.sh/capacity-type"):
            found.append(f"NodePool {pool.name}: GPU pool without spot capacity")
    return found


def warm_spares_only_on_spot_pools(resources: list[Resource], environment: str) -> list[str]:
    """Warm spares keep GPU nodes idle on purpose: only on a pool of this stack that buys spot capacity."""
    pools = {pool.props.get("metadata", {}).get("name"): pool for pool in _of(resources, NODE_POOL)}
    found = []
    for deployment in _of(resources, DEPLOYMENT):
        template = deployment.props.get("spec", {}).get("template", {})
        if template.get("metadata", {}).get("labels", {}).get(COMPONENT_LABEL) != WARM_SPARE_COMPONENT:
            continue
        name = template.get("spec", {}).get("nodeSelector", {}).get(POOL_LABEL)
        if name not in pools:
            found.append(f"Deployment {deployment.name}: warm spares on {name!r}, which is no NodePool of this stack")
        elif "spot" not in _requirement(pools[name], "karpenter.sh/capacity-type"):
            found.append(f"Deployment {deployment.name}: warm spares on NodePool {name}, which has no spot capacity")
    return found


def on_demand_gpus_only_when_configured(resources: list[Resource], environment: str) -> list[str]:
    found = []
    for pool in _of(resources, NODE_POOL):
        labels = pool.props.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
        on_demand = "on-demand" in _requirement(pool, "karpenter.sh/capacity-type")
        if on_demand and labels.get(ON_DEMAND_FALLBACK_LABEL) != "true":
            found.append(f"NodePool {pool.name}: on-demand GPU capacity the pool's config does not allow")
    for group in _of(resources, "aws:eks/nodeGroup:NodeGroup"):
        gpu = [t for t in group.props.get("instanceTypes", []) if t.split(".")[0] in GPU_FAMILIES]
        if gpu:
            found.append(f"NodeGroup {group.name}: on-demand GPU instances {gpu} in a managed node group")
    return found


def buckets_are_encrypted_and_private(resources: list[Resource], environment: str) -> list[str]:
    buckets = _of(resources, "aws:s3/bucket:Bucket")
    encrypted = [r for r in _of(resources, "aws:s3/bucketServerSideEncryptionConfiguration:"
                                           "BucketServerSideEncryptionConfiguration")
                 if any(rule.get("applyServerSideEncryptionByDefault", {}).get("sseAlgorithm")
                        for rule in r.props.get("rules", []))]
    private = [r for r in _of(resources, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
               if all(r.props.get(k) for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                                   "restrictPublicBuckets"))]
    found = []
    if len(encrypted) < len(buckets):
        found.append(f"{len(buckets) - len(encrypted)} S3 bucket(s) without default encryption")
    if len(private) < len(buckets):
        found.append(f"{len(buckets) - len(private)} S3 bucket(s) without a full public access block")
    return found


def eks_secrets_are_encrypted(resources: list[Resource], environment: str) -> list[str]:
    found = []
    for cluster in _of(resources, "aws:eks/cluster:Cluster"):
        config = cluster.props.get("encryptionConfig") or {}
        if "secrets" not in config.get("resources", []) or not config.get("provider", {}).get("keyArn"):
            found.append(f"EKS cluster {cluster.name}: secrets are not encrypted with a KMS key")
    return found


def _opens_ray_port(cidrs: list[str], from_port: int, to_port: int, protocol: str) -> list[int]:
    if not any(c in OPEN_CIDRS for c in cidrs):
        return []
    if str(protocol) in ("-1", "all"):
        return list(RAY_PORTS)
    return [p for p in RAY_PORTS if from_port <= p <= to_port]


def no_public_ray_ports(resources: list[Resource], environment: str) -> list[str]:
    found = []
    for r in resources:
        rules = []
        if r.type == "aws:ec2/securityGroup:SecurityGroup":
            rules = [(i.get("cidrBlocks", []) + i.get("ipv6CidrBlocks", []), i.get("fromPort", 0),
                      i.get("toPort", 0), i.get("protocol", "tcp")) for i in r.props.get("ingress", [])]
        elif r.type == "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule":
            p = r.props
            rules = [([p.get("cidrIpv4", ""), p.get("cidrIpv6", "")], p.get("fromPort", 0), p.get("toPort", 0),
                      p.get("ipProtocol", "tcp"))]
        elif r.type == "aws:ec2/securityGroupRule:SecurityGroupRule" and r.props.get("type") == "ingress":
            p = r.props
            rules = [(p.get("cidrBlocks", []) + p.get("ipv6CidrBlocks", []), p.get("fromPort", 0),
                      p.get("toPort", 0), p.get("protocol", "tcp"))]
        for cidrs, low, high, protocol in rules:
            ports = _opens_ray_port(cidrs, low, high, protocol)
            if ports:
                found.append(f"{r.type.rsplit(':', 1)[1]} {r.name}: opens Ray port(s) {ports} to the internet")
    return found


def everything_is_tagged(resources: list[Resource], environment: str) -> list[str]:
    found = []
    for r in resources:
        missing = [k for k in (f"{NAMESPACE}:project", f"{NAMESPACE}:stack") if k not in (r.props.get("tags") or {})]
        if r.type in TAGGABLE and missing:
            found.append(f"{r.type.rsplit(':', 1)[1]} {r.name}: missing tag(s) {missing}")
    return found


def github_roles_pin_one_subject(resources: list[Resource], environment: str) -> list[str]:
    """A role GitHub's OIDC tokens may assume names exactly one repository and environment (or its pull requests):
    a wildcard subject would let any branch, fork or repository deploy."""
    found = []
    for role in _of(resources, "aws:iam/role:Role"):
        for statement in _statements(role.props.get("assumeRolePolicy")):
            if GITHUB_OIDC_HOST not in str(statement.get("Principal", {}).get("Federated", "")):
                continue
            conditions = statement.get("Condition", {})
            subject = conditions.get("StringEquals", {}).get(f"{GITHUB_OIDC_HOST}:sub")
            if not isinstance(subject, str) or any(c in subject for c in "*?") or "StringLike" in conditions:
                found.append(f"Role {role.name}: GitHub OIDC trust without one exact subject (got {subject!r}); "
                             "use StringEquals repo:OWNER/NAME:environment:ENV")
            elif conditions.get("StringEquals", {}).get(f"{GITHUB_OIDC_HOST}:aud") != GITHUB_OIDC_AUDIENCE:
                found.append(f"Role {role.name}: GitHub OIDC trust without the sts.amazonaws.com audience")
    return found


def _statements(policy) -> list[dict]:
    if isinstance(policy, str):
        try:
            policy = json.loads(policy)
        except ValueError:
            return []
    statements = policy.get("Statement", []) if isinstance(policy, dict) else []
    return [s for s in ([statements] if isinstance(statements, dict) else statements) if isinstance(s, dict)]


def prod_state_is_protected(resources: list[Resource], environment: str) -> list[str]:
    if environment != "prod":
        return []
    found = [f"{r.type.rsplit(':', 1)[1]} {r.name}: stateful resource in prod without protect and retainOnDelete"
             for r in resources if r.type in STATEFUL and not (r.protect and r.retain_on_delete)]
    found += [f"EKS cluster {r.name}: deletion protection is off in prod"
              for r in _of(resources, "aws:eks/cluster:Cluster") if not r.props.get("deletionProtection")]
    return found


POLICIES = (
    Policy("gpu-pools-tainted-spot", "GPU node pools are tainted nvidia.com/gpu and include spot capacity",
           gpu_pools_are_tainted_spot),
    Policy("warm-spares-on-spot", "Warm spare GPU nodes are held only on pools of spot capacity",
           warm_spares_only_on_spot_pools),
    Policy("on-demand-gpus-only-when-configured", "Nothing runs on-demand GPUs unless a pool's config allows it",
           on_demand_gpus_only_when_configured),
    Policy("buckets-encrypted-private", "S3 buckets are encrypted by default and block all public access",
           buckets_are_encrypted_and_private),
    Policy("eks-secrets-encrypted", "EKS encrypts Kubernetes secrets with a KMS key", eks_secrets_are_encrypted),
    Policy("no-public-ray-ports", "No security group opens 6379, 8265 or 10001 to 0.0.0.0/0 or ::/0",
           no_public_ray_ports),
    Policy("tagged", f"Every taggable AWS resource carries {NAMESPACE}:project and {NAMESPACE}:stack tags",
           everything_is_tagged),
    Policy("github-roles-one-subject", "Roles GitHub Actions assume trust one repository and environment, no wildcard",
           github_roles_pin_one_subject),
    Policy("prod-protected", "In prod, stateful resources are protected and retained on delete",
           prod_state_is_protected),
)


def violations(resources: list[Resource], environment: str) -> dict[str, list[str]]:
    """Policy name -> its violations, for the policies that have any."""
    return {p.name: found for p in POLICIES if (found := p.check(resources, environment))}
