"""Each policy with a passing and a violating case; the same predicates back the CrossGuard pack."""

import copy
import json

import pytest

from cluster.warm_spares import warm_spares
from infra.aws.github import trust_statement
from infra.aws.karpenter_manifests import gpu_node_pool
from infra.kernel.config import GpuPoolConfig, TrainingJobConfig
from infra.policies import POLICIES, Resource, violations

TAGS = {"spotray:project": "spotray", "spotray:stack": "prod", "spotray:environment": "prod"}
POOL = gpu_node_pool(GpuPoolConfig("a10g", ("g5",)), "gpu")


def node_pool(edit=None) -> Resource:
    manifest = copy.deepcopy(POOL)
    if edit:
        edit(manifest["spec"]["template"])
    return Resource("kubernetes:karpenter.sh/v1:NodePool", "pool", manifest)


def spares(pool: str) -> Resource:
    deployment = warm_spares(GpuPoolConfig(pool, ("g5",), warm_spares=1), TrainingJobConfig(), "x.io/t:1", "spotray")
    return Resource("kubernetes:apps/v1:Deployment", f"spares-{pool}", deployment)


def capacity(types):
    def edit(template):
        template["spec"]["requirements"][0]["values"] = types
    return edit


BUCKET = Resource("aws:s3/bucket:Bucket", "b", {"tags": TAGS}, protect=True, retain_on_delete=True)
SSE = Resource("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration", "sse",
               {"rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}}]})
BLOCK = Resource("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", "pab",
                 dict.fromkeys(("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"),
                               True))
CLUSTER = Resource("aws:eks/cluster:Cluster", "eks", {"tags": TAGS, "deletionProtection": True, "encryptionConfig": {
    "provider": {"keyArn": "arn:aws:kms:key"}, "resources": ["secrets"]}}, protect=True, retain_on_delete=True)


def sg(port: int, cidr: str = "0.0.0.0/0", protocol: str = "tcp") -> Resource:
    return Resource("aws:ec2/securityGroup:SecurityGroup", "sg", {"tags": TAGS, "ingress": [
        {"cidrBlocks": [cidr], "fromPort": port, "toPort": port, "protocol": protocol}]})


def github_role(subject: str, test: str = "StringEquals", audience: str = "sts.amazonaws.com") -> Resource:
    statement = trust_statement("arn:aws:iam::123456789012:oidc-provider/token.actions.githubusercontent.com",
                                subject)
    conditions = statement["Condition"]["StringEquals"]
    conditions["token.actions.githubusercontent.com:aud"] = audience
    statement["Condition"] = {test: conditions}
    policy = json.dumps({"Version": "2012-10-17", "Statement": [statement]})
    return Resource("aws:iam/role:Role", "deploy", {"tags": TAGS, "assumeRolePolicy": policy})


CASES = {  # policy -> (passing resources, violating resources, environment)
    "gpu-pools-tainted-spot": ([node_pool()], [node_pool(lambda t: t["spec"].update(taints=[]))], "dev"),
    "on-demand-gpus-only-when-configured": (
        [node_pool(), Resource("aws:eks/nodeGroup:NodeGroup", "core", {"instanceTypes": ["m7i.xlarge"]})],
        [node_pool(capacity(["spot", "on-demand"]))], "dev"),
    "warm-spares-on-spot": ([node_pool(capacity(["spot", "on-demand"])), spares("a10g")],
                            [node_pool(capacity(["on-demand"])), spares("a10g")], "dev"),
    "buckets-encrypted-private": ([BUCKET, SSE, BLOCK], [BUCKET, BLOCK], "dev"),
    "eks-secrets-encrypted": ([CLUSTER], [Resource("aws:eks/cluster:Cluster", "eks", {"encryptionConfig": None})],
                              "dev"),
    "no-public-ray-ports": ([sg(443), sg(8265, cidr="10.0.0.0/8")], [sg(8265)], "dev"),
    "tagged": ([BUCKET], [Resource("aws:s3/bucket:Bucket", "b", {"tags": {"spotray:project": "spotray"}})], "dev"),
    "github-roles-one-subject": ([github_role("repo:acme/spotray:environment:prod")],
                                 [github_role("repo:acme/spotray:*")], "prod"),
    "prod-protected": ([BUCKET, CLUSTER], [Resource("aws:kms/key:Key", "k", {"tags": TAGS}, protect=True)], "prod"),
}


def test_every_policy_has_cases():
    assert set(CASES) == {p.name for p in POLICIES}


@pytest.mark.parametrize("name", sorted(CASES))
def test_policy_passes_and_catches_its_violation(name):
    passing, violating, environment = CASES[name]
    policy = next(p for p in POLICIES if p.name == name)
    assert policy.check(passing, environment) == []
    assert policy.check(violating, environment)


@pytest.mark.parametrize(("resource", "fragment"), [
    (node_pool(capacity(["on-demand"])), "without spot capacity"),
    (spares("h100"), "warm spares on 'h100', which is no NodePool of this stack"),
    (Resource("aws:eks/nodeGroup:NodeGroup", "core", {"instanceTypes": ["g5.xlarge"]}), "['g5.xlarge']"),
    (sg(0, protocol="-1"), "[6379, 8265, 10001]"),
    (sg(10001, cidr="::/0"), "[10001]"),
    (Resource("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "r",
              {"cidrIpv4": "0.0.0.0/0", "fromPort": 6000, "toPort": 7000, "ipProtocol": "tcp"}), "[6379]"),
    (Resource("aws:eks/cluster:Cluster", "eks", {**CLUSTER.props, "deletionProtection": False}, True, True),
     "deletion protection is off"),
    (github_role("repo:acme/spotray:environment:prod", test="StringLike"), "without one exact subject"),
    (github_role("repo:acme/spotray:environment:pro?"), "'repo:acme/spotray:environment:pro?'"),
    (github_role("repo:acme/spotray:pull_request", audience="*"), "without the sts.amazonaws.com audience"),
])
def test_violations_say_what_is_wrong(resource, fragment):
    found = [m for messages in violations([resource], "prod").values() for m in messages]
    assert any(fragment in m for m in found), found


def test_outside_prod_unprotected_state_is_allowed():
    unprotected = Resource("aws:s3/bucket:Bucket", "b", {"tags": TAGS})
    assert "prod-protected" not in violations([unprotected, SSE, BLOCK], "dev")
    assert "prod-protected" in violations([unprotected, SSE, BLOCK], "prod")
