import json

import pulumi

from infra.aws.eks import ADMIN_POLICY, CONTROL_PLANE_LOGS, Cluster, ClusterArgs
from infra.kernel.config import KubernetesConfig
from infra.plan import SECRET, run_mocked

TAGS = {"spotray:project": "spotray", "spotray:stack": "t"}
BOUNDARY = "arn:aws:iam::123456789012:policy/spotray-t-boundary"
ADMIN = "arn:aws:iam::123456789012:role/platform-admin"


def build(protect=False, **k8s):
    config = KubernetesConfig(**{"public_access_cidrs": ("203.0.113.0/24",), "admin_principals": (ADMIN,), **k8s})

    def program():
        cluster = Cluster("c", ClusterArgs("spotray-t", config, "us-west-2", ["subnet-a", "subnet-b"], TAGS, protect,
                                           BOUNDARY))
        return {"kubeconfig": cluster.kubeconfig, "derived": cluster.kubeconfig.apply(len),
                "revealed": pulumi.Output.unsecret(cluster.kubeconfig)}

    return run_mocked(program, "spotray", "t", "us-west-2")


def test_secrets_are_encrypted_with_a_rotating_kms_key_and_control_plane_logs_are_on():
    plan = build()
    eks = plan.named("c-eks").inputs
    key = plan.named("c-secrets")
    assert eks["encryptionConfig"] == {"provider": {"keyArn": f"arn:aws:mock:us-west-2:123456789012:{key.name}"},
                                       "resources": ["secrets"]}
    assert key.inputs["enableKeyRotation"] is True
    assert eks["enabledClusterLogTypes"] == CONTROL_PLANE_LOGS
    assert eks["accessConfig"]["authenticationMode"] == "API"
    assert eks["vpcConfig"]["publicAccessCidrs"] == ["203.0.113.0/24"]


def test_admins_get_access_entries_and_the_cluster_an_oidc_provider():
    plan = build()
    assert [e.inputs["principalArn"] for e in plan.of_type("aws:eks/accessEntry:AccessEntry")] == [ADMIN]
    association = plan.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")[0].inputs
    assert (association["policyArn"], association["accessScope"]) == (ADMIN_POLICY, {"type": "cluster"})
    oidc = plan.of_type("aws:iam/openIdConnectProvider:OpenIdConnectProvider")[0].inputs
    assert oidc["url"].startswith("https://oidc.eks.us-west-2.amazonaws.com/")
    assert oidc["clientIdLists"] == ["sts.amazonaws.com"]
    tag = plan.of_type("aws:ec2/tag:Tag")[0].inputs
    assert (tag["key"], tag["value"], tag["resourceId"]) == ("karpenter.sh/discovery", "spotray-t", "sg-cluster")


def test_a_private_only_endpoint_sets_no_public_cidrs():
    plan = build(public_endpoint=False, public_access_cidrs=())
    vpc = plan.named("c-eks").inputs["vpcConfig"]
    assert vpc["endpointPublicAccess"] is False and "publicAccessCidrs" not in vpc


def test_the_kubeconfig_is_a_secret_that_authenticates_with_aws_eks_get_token():
    plan = build()
    assert plan.outputs["kubeconfig"] == plan.outputs["derived"] == SECRET  # what derives from it stays secret
    kubeconfig = json.loads(plan.outputs["revealed"])
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://spotray-t.eks.us-west-2.amazonaws.com"
    assert kubeconfig["users"][0]["user"]["exec"]["args"][:4] == ["eks", "get-token", "--cluster-name", "spotray-t"]


def test_protect_makes_the_cluster_and_its_key_protected_retained_and_deletion_protected():
    plan = build(protect=True)
    for name in ("c-eks", "c-secrets"):
        assert (plan.named(name).protect, plan.named(name).retain_on_delete) == (True, True)
    assert plan.named("c-eks").inputs["deletionProtection"] is True
    assert not build().named("c-eks").protect
