"""The EKS control plane from plain ``pulumi_aws`` resources: secrets encrypted with a KMS key, control-plane
logs, API-mode access entries, an OIDC provider, and a kubeconfig that authenticates with ``aws eks get-token``."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws import iam
from infra.aws.deploy_policy import MANAGED_POLICIES
from infra.kernel.config import KubernetesConfig
from infra.kernel.names import DISCOVERY_TAG

CONTROL_PLANE_LOGS = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
# AWS no longer checks the thumbprint for the EKS OIDC issuer, but the API still wants one.
OIDC_THUMBPRINT = "9e99a48a9960b14926bb7f3b02e22da2b0ab7280"


@dataclass(frozen=True)
class ClusterArgs:
    name: str
    config: KubernetesConfig
    region: str
    subnet_ids: list[pulumi.Input[str]]
    tags: dict[str, str]
    protect: bool
    boundary: pulumi.Input[str]  # the permissions boundary of every role the stack creates


class Cluster(pulumi.ComponentResource):
    name: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:infra:Cluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        stateful = pulumi.ResourceOptions(parent=self, protect=args.protect, retain_on_delete=args.protect)
        k8s, tags = args.config, args.tags
        key = aws.kms.Key(f"{name}-secrets", description=f"EKS secrets encryption for {args.name}",
                          enable_key_rotation=True, deletion_window_in_days=30, tags=tags, opts=stateful)
        role = iam.role(f"{name}-control-plane", "eks.amazonaws.com", MANAGED_POLICIES["control-plane"], tags,
                        args.boundary, child)
        logs = aws.cloudwatch.LogGroup(f"{name}-logs", name=f"/aws/eks/{args.name}/cluster", retention_in_days=90,
                                       tags=tags, opts=child)
        vpc_config: aws.eks.ClusterVpcConfigArgsDict = {"subnet_ids": args.subnet_ids, "endpoint_private_access": True,
                                                         "endpoint_public_access": k8s.public_endpoint}
        if k8s.public_endpoint:
            vpc_config["public_access_cidrs"] = list(k8s.public_access_cidrs)
        cluster = aws.eks.Cluster(
            f"{name}-eks", name=args.name, version=k8s.version, role_arn=role.arn, vpc_config=vpc_config,
            kubernetes_network_config={"service_ipv4_cidr": k8s.service_cidr},
            encryption_config={"provider": {"key_arn": key.arn}, "resources": ["secrets"]},
            enabled_cluster_log_types=CONTROL_PLANE_LOGS,
            access_config={"authentication_mode": "API", "bootstrap_cluster_creator_admin_permissions": True},
            deletion_protection=args.protect,
            tags=tags,
            opts=pulumi.ResourceOptions.merge(stateful, pulumi.ResourceOptions(depends_on=[logs])))
        # Karpenter finds the security group of the nodes it launches by this tag.
        aws.ec2.Tag(f"{name}-sg-discovery", resource_id=cluster.vpc_config.cluster_security_group_id,
                    key=DISCOVERY_TAG, value=args.name, opts=child)
        aws.iam.OpenIdConnectProvider(f"{name}-oidc", url=cluster.identities[0].oidcs[0].issuer,
                                      client_id_lists=["sts.amazonaws.com"], thumbprint_lists=[OIDC_THUMBPRINT],
                                      tags=tags, opts=child)
        for i, principal in enumerate(k8s.admin_principals):
            entry = aws.eks.AccessEntry(f"{name}-admin-{i}", cluster_name=cluster.name, principal_arn=principal,
                                        type="STANDARD", tags=tags, opts=child)
            aws.eks.AccessPolicyAssociation(f"{name}-admin-{i}", cluster_name=cluster.name, principal_arn=principal,
                                            policy_arn=ADMIN_POLICY, access_scope={"type": "cluster"},
                                            opts=pulumi.ResourceOptions(parent=self, depends_on=[entry]))
        self.cluster = cluster
        self.name = cluster.name
        self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(
            cluster.name, cluster.endpoint, cluster.certificate_authority.data).apply(
                lambda v: kubeconfig(v[0], v[1], v[2], args.region)))
        self.register_outputs({"name": self.name, "kubeconfig": self.kubeconfig})


def kubeconfig(cluster_name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig that gets a token from the AWS CLI with the caller's credentials."""
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
                     "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region]}}
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": cluster_name,
        "clusters": [{"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
        "users": [{"name": cluster_name, "user": user}],
    })
