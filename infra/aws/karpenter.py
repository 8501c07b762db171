"""Karpenter: its IAM (controller through Pod Identity, node role with an access entry), the SQS interruption
queue fed by EventBridge (spot interruption warnings, rebalance recommendations, health and state-change
events), the pinned Helm chart with its ServiceMonitor (its node and price metrics feed the cluster dashboard and
the runs' cost), and the GPU ``EC2NodeClass`` plus one ``NodePool`` per GPU pool."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.aws import iam
from infra.aws.karpenter_manifests import ec2_node_class, gpu_node_pool
from infra.aws.nodes import NODE_POLICIES
from infra.kernel import helm
from infra.kernel.config import GpuPoolConfig
from infra.kernel.names import CORE_SELECTOR
from infra.kernel.versions import KARPENTER

NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "karpenter"
GPU_NODE_CLASS = "gpu"
INTERRUPTION_EVENTS = {  # rule name -> EventBridge pattern
    "spot-interruption": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "state-change": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
    "health": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
}


@dataclass(frozen=True)
class KarpenterArgs:
    cluster_name: pulumi.Input[str]
    cluster_endpoint: pulumi.Input[str]
    region: str
    gpu_pools: tuple[GpuPoolConfig, ...]
    tags: dict[str, str]
    provider: k8s.Provider
    depends_on: list[pulumi.Resource]  # with the ServiceMonitor CRD where the stack installs it
    monitor_labels: dict[str, str]  # what the stack's Prometheus selects ServiceMonitors by
    boundary: pulumi.Input[str]  # the permissions boundary of every role the stack creates


class Karpenter(pulumi.ComponentResource):
    def __init__(self, name: str, args: KarpenterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:infra:Karpenter", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = args.tags
        node_role = iam.role(f"{name}-node", "ec2.amazonaws.com", NODE_POLICIES, tags, args.boundary, child)
        aws.eks.AccessEntry(f"{name}-node", cluster_name=args.cluster_name, principal_arn=node_role.arn,
                            type="EC2_LINUX", tags=tags, opts=child)
        queue = self._interruption_queue(name, tags, child)
        iam.pod_role(f"{name}-controller", args.cluster_name, NAMESPACE, SERVICE_ACCOUNT,
                     controller_policy(args.region, args.cluster_name, node_role.arn, queue.arn), tags,
                     args.boundary, child)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.provider)
        values = chart_values(args.cluster_name, args.cluster_endpoint, queue.name, args.monitor_labels)
        after_cluster = pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(depends_on=args.depends_on))
        release = helm.release(f"{name}-chart", KARPENTER, NAMESPACE, values, after_cluster)
        after_chart = pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(depends_on=[release]))
        node_class = pulumi.Output.all(args.cluster_name, node_role.name).apply(
            lambda v: ec2_node_class(GPU_NODE_CLASS, v[0], v[1], tags))
        _custom_resource(f"{name}-nodeclass-{GPU_NODE_CLASS}", node_class, "karpenter.k8s.aws/v1", "EC2NodeClass",
                         after_chart)
        for pool in args.gpu_pools:
            _custom_resource(f"{name}-nodepool-{pool.name}", gpu_node_pool(pool, GPU_NODE_CLASS), "karpenter.sh/v1",
                             "NodePool", after_chart)
        self.queue_name = queue.name
        self.node_pools = [pool.name for pool in args.gpu_pools]
        self.register_outputs({"queue_name": self.queue_name, "node_pools": self.node_pools})

    def _interruption_queue(self, name: str, tags: dict[str, str], opts: pulumi.ResourceOptions) -> aws.sqs.Queue:
        queue = aws.sqs.Queue(f"{name}-interruptions", message_retention_seconds=300, sqs_managed_sse_enabled=True,
                              tags=tags, opts=opts)
        aws.sqs.QueuePolicy(f"{name}-interruptions", queue_url=queue.url, policy=iam.policy_document([
            {"Effect": "Allow", "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
             "Action": "sqs:SendMessage", "Resource": queue.arn},
            {"Effect": "Deny", "Principal": "*", "Action": "sqs:*", "Resource": queue.arn,
             "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        ]), opts=opts)
        for rule_name, pattern in INTERRUPTION_EVENTS.items():
            rule = aws.cloudwatch.EventRule(f"{name}-{rule_name}", event_pattern=pulumi.Output.json_dumps(pattern),
                                            tags=tags, opts=opts)
            aws.cloudwatch.EventTarget(f"{name}-{rule_name}", rule=rule.name, arn=queue.arn, opts=opts)
        return queue


def _custom_resource(name: str, manifest: dict | pulumi.Output, api_version: str, kind: str,
                     opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    manifest = pulumi.Output.from_input(manifest)
    return k8s.apiextensions.CustomResource(name, api_version=api_version, kind=kind,
                                            metadata=manifest.apply(lambda m: m["metadata"]),
                                            spec=manifest.apply(lambda m: m["spec"]), opts=opts)


def chart_values(cluster_name: pulumi.Input[str], endpoint: pulumi.Input[str], queue: pulumi.Input[str],
                 monitor_labels: dict[str, str]) -> dict:
    """Helm values for the pinned chart; tests check every key exists in its ``values.yaml``. Its ServiceMonitor
    carries ``monitor_labels``, so the stack's Prometheus scrapes the controller's metrics."""
    return {
        "settings": {"clusterName": cluster_name, "clusterEndpoint": endpoint, "interruptionQueue": queue},
        "replicas": 2,
        "controller": {"resources": {"requests": {"cpu": "500m", "memory": "512Mi"},
                                     "limits": {"memory": "1Gi"}}},
        "nodeSelector": CORE_SELECTOR,
        "serviceMonitor": {"enabled": True, "additionalLabels": dict(monitor_labels)},
    }


def controller_policy(region: str, cluster_name: pulumi.Input[str], node_role_arn: pulumi.Input[str],
                      queue_arn: pulumi.Input[str]) -> pulumi.Output[str]:
    """What the controller may do: launch and terminate instances it tagged, pass only the node role, read
    the interruption queue, and look up prices, AMIs and the cluster."""
    owned = pulumi.Output.from_input(cluster_name).apply(
        lambda name: {"StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{name}": "owned"}})
    return iam.policy_document([
        {"Sid": "Launch", "Effect": "Allow", "Resource": "*",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate", "ec2:CreateTags"],
         "Condition": {"StringEquals": {"aws:RequestedRegion": region}}},
        {"Sid": "Owned", "Effect": "Allow", "Resource": "*", "Condition": owned,
         "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"]},
        {"Sid": "Read", "Effect": "Allow", "Resource": "*",
         "Action": ["ec2:DescribeAvailabilityZones", "ec2:DescribeImages", "ec2:DescribeInstances",
                    "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes", "ec2:DescribeLaunchTemplates",
                    "ec2:DescribeSecurityGroups", "ec2:DescribeSpotPriceHistory", "ec2:DescribeSubnets",
                    "pricing:GetProducts", "ssm:GetParameter", "eks:DescribeCluster"]},
        {"Sid": "PassNodeRole", "Effect": "Allow", "Action": "iam:PassRole", "Resource": node_role_arn},
        {"Sid": "InstanceProfiles", "Effect": "Allow", "Resource": "*",
         "Action": ["iam:CreateInstanceProfile", "iam:TagInstanceProfile", "iam:AddRoleToInstanceProfile",
                    "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile", "iam:GetInstanceProfile",
                    "iam:ListInstanceProfiles"]},
        {"Sid": "Interruptions", "Effect": "Allow", "Resource": queue_arn,
         "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"]},
    ])
