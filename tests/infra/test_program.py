"""The composed program for every stack file, and ``spotray plan``."""

import importlib
import inspect
import json
import subprocess
import sys

import pytest

from infra.cli import main
from infra.policies import TAGGABLE
from tests.repo import REPO, STACKS
from tests.schemas import pinned_chart_values, unknown_values_keys

AWS_STACKS = ("dev", "staging", "prod")


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_plans_with_no_policy_violation(stack_plans, stack):
    cfg, plan = stack_plans[stack]
    assert plan.violations(cfg.environment) == {}


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_aws_stacks_have_the_core_node_group_the_interruption_queue_and_a_spot_pool_per_gpu_pool(stack_plans, stack):
    cfg, plan = stack_plans[stack]
    assert len(plan.of_type("aws:eks/nodeGroup:NodeGroup")) == 1
    assert len(plan.of_type("aws:sqs/queue:Queue")) == 1
    pools = plan.of_type("kubernetes:karpenter.sh/v1:NodePool")
    assert sorted(p.inputs["metadata"]["name"] for p in pools) == sorted(p.name for p in cfg.gpu_pools)
    assert set(plan.outputs) >= {"clusterName", "kubeconfig", "ecrUrl", "storageEndpoint", "storageBucket",
                                 "gpuPools"}
    assert plan.outputs["gpuPools"] == [p.name for p in cfg.gpu_pools]
    has_bucket = bool(plan.of_type("aws:s3/bucket:Bucket"))
    assert has_bucket == (cfg.storage.backend == "s3")


def test_components_use_spotray_type_tokens_and_own_their_resources(stack_plans):
    _, plan = stack_plans["prod"]
    components = {r.name for r in plan.resources if not r.custom}
    ours = {r.type for r in plan.resources if not r.custom} - {"kubernetes:yaml/v2:ConfigFile"}
    assert ours == {f"spotray:infra:{n}" for n in (
        "PermissionsBoundary", "Network", "Cluster", "CoreNodes", "Karpenter", "ImageRepository", "CheckpointBucket",
        "GitHubRoles")} | {
        "spotray:cluster:KubeRayOperator", "spotray:cluster:SystemNamespace", "spotray:cluster:GpuPlumbing",
        "spotray:cluster:TrainingNamespace",
        "spotray:monitoring:MonitoringStack", "spotray:monitoring:MonitoringObjects"}
    orphans = [r.name for r in plan.resources if r.custom and r.parent not in components
               and not r.type.startswith("pulumi:providers:")]
    assert orphans == []


@pytest.mark.parametrize("stack", STACKS)
def test_every_helm_release_sets_only_keys_its_pinned_chart_has(stack_plans, stack):
    _, plan = stack_plans[stack]
    releases = plan.of_type("kubernetes:helm.sh/v3:Release")
    assert len(releases) >= 5
    for release in releases:
        defaults = pinned_chart_values(release.inputs["chart"], release.inputs["version"])
        assert unknown_values_keys(release.inputs["values"], defaults) == [], release.name


def test_a_subchart_key_is_checked_against_the_subchart_as_well():
    defaults = pinned_chart_values("kube-prometheus-stack", "88.5.3")
    values = {"grafana": {"nodeSelector": {"a": "b"}, "nodeSelectr": {}, "defaultDashboardsEnabled": True}}
    assert unknown_values_keys(values, defaults) == ["grafana.nodeSelectr"]


def test_the_existing_cluster_stack_creates_no_aws_resource(stack_plans):
    _, plan = stack_plans["existing"]
    assert not [r for r in plan.resources if r.type.startswith("aws:")]
    assert plan.of_type("pulumi:providers:kubernetes")


def test_taggable_covers_every_aws_type_the_program_creates_that_takes_tags(stack_plans):
    created = {r.type for _, plan in stack_plans.values() for r in plan.resources if r.type.startswith("aws:")}
    takes_tags = {t for t in created if "tags" in inspect.signature(_resource_class(t)._internal_init).parameters}
    assert takes_tags == set(TAGGABLE) & created
    assert set(TAGGABLE) <= created  # no stale entries


def _resource_class(type_token: str):
    """aws:ec2/routeTable:RouteTable -> pulumi_aws.ec2.RouteTable"""
    _, module, name = type_token.split(":")
    return getattr(importlib.import_module(f"pulumi_aws.{module.split('/')[0]}"), name)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_plan_json_lists_the_spot_pools_the_queue_and_the_core_group_with_secrets_masked(stack, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["plan", "--stack", stack, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    types = [r["type"] for r in result["resources"]]
    assert "kubernetes:karpenter.sh/v1:NodePool" in types
    assert "aws:sqs/queue:Queue" in types and "aws:eks/nodeGroup:NodeGroup" in types
    assert result["outputs"]["kubeconfig"] == "[secret]"
    provider = next(r for r in result["resources"] if r["type"] == "pulumi:providers:kubernetes")
    assert provider["inputs"]["kubeconfig"] == "[secret]"
    assert result["policyViolations"] == {}
    assert all(r["parent"] for r in result["resources"] if r["type"].startswith("aws:"))


def test_plan_output_is_the_same_bytes_in_every_process_for_reviewable_diffs():
    """Separate processes: the engine's maps arrive in an order that varies between them."""
    runs = [subprocess.run([sys.executable, "-m", "infra.cli", "plan", "--stack", "prod", "--json"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout for _ in range(2)]
    assert runs[0] == runs[1]


def test_plan_text_shows_the_tree_and_a_bad_stack_is_one_error_line(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["plan", "--stack", "prod"]) == 0
    out = capsys.readouterr().out
    assert "  + spotray:infra:Karpenter  karpenter" in out
    assert "    + kubernetes:karpenter.sh/v1:NodePool  karpenter-nodepool-h100-spot" in out
    assert "policies: all pass" in out
    assert main(["plan", "--stack", "qa"]) == 2
    assert capsys.readouterr().err.startswith("spotray: error: no stack file")
