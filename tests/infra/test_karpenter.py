import json

import jsonschema
import pytest

from infra.aws.karpenter import INTERRUPTION_EVENTS, Karpenter, KarpenterArgs, chart_values
from infra.aws.karpenter_manifests import ec2_node_class, gpu_node_pool
from infra.kernel.config import GpuPoolConfig
from infra.kernel.versions import KARPENTER
from infra.plan import run_mocked
from tests.schemas import chart_defaults, unknown_values_keys, validate_custom_resource

NODEPOOL_CRD = "karpenter-v1.14.1_karpenter.sh_nodepools.yaml"
NODECLASS_CRD = "karpenter-v1.14.1_karpenter.k8s.aws_ec2nodeclasses.yaml"
TAGS = {"spotray:project": "spotray", "spotray:stack": "t"}
BOUNDARY = "arn:aws:iam::123456789012:policy/spotray-t-boundary"
SPOT = GpuPoolConfig("a10g", ("g5", "g6"), sizes=("xlarge", "2xlarge"), gpu_limit=8, labels={"team/x": "y"})
FALLBACK = GpuPoolConfig("h100", ("p5",), gpu_limit=16, on_demand_fallback=True)


def requirement(pool: dict, key: str) -> list[str]:
    return next(r["values"] for r in pool["spec"]["template"]["spec"]["requirements"] if r["key"] == key)


@pytest.mark.parametrize("pool", [SPOT, FALLBACK], ids=lambda p: p.name)
def test_node_pools_and_the_node_class_validate_against_the_karpenter_crds(pool):
    validate_custom_resource(gpu_node_pool(pool, "gpu"), NODEPOOL_CRD)
    validate_custom_resource(ec2_node_class("gpu", "spotray-t", "node-role", TAGS), NODECLASS_CRD)


def test_the_crd_check_rejects_a_wrong_field():
    broken = gpu_node_pool(SPOT, "gpu")
    broken["spec"]["disruption"]["consolidationPolicy"] = "Always"
    with pytest.raises(jsonschema.ValidationError, match="Always"):
        validate_custom_resource(broken, NODEPOOL_CRD)
    broken = gpu_node_pool(SPOT, "gpu")
    broken["spec"]["template"]["spec"]["tolerations"] = []
    with pytest.raises(jsonschema.ValidationError, match="tolerations"):
        validate_custom_resource(broken, NODEPOOL_CRD)


def test_gpu_pools_are_spot_tainted_and_never_voluntarily_evict_training():
    pool = gpu_node_pool(SPOT, "gpu")
    template = pool["spec"]["template"]
    assert requirement(pool, "karpenter.sh/capacity-type") == ["spot"]
    assert requirement(pool, "karpenter.k8s.aws/instance-family") == ["g5", "g6"]
    assert requirement(pool, "karpenter.k8s.aws/instance-size") == ["xlarge", "2xlarge"]
    assert template["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    assert template["metadata"]["labels"] == {"team/x": "y", "spotray.dev/pool": "a10g", "spotray.dev/gpu": "true"}
    assert template["spec"]["expireAfter"] == "Never"
    disruption = pool["spec"]["disruption"]
    assert disruption["consolidationPolicy"] == "WhenEmpty"
    assert {"nodes": "0", "reasons": ["Drifted", "Underutilized"]} in disruption["budgets"]
    assert pool["spec"]["limits"] == {"nvidia.com/gpu": 8}


def test_on_demand_capacity_only_for_a_pool_that_asks_for_the_fallback():
    pool = gpu_node_pool(FALLBACK, "gpu")
    assert requirement(pool, "karpenter.sh/capacity-type") == ["spot", "on-demand"]
    assert pool["spec"]["template"]["metadata"]["labels"]["spotray.dev/on-demand-fallback"] == "true"
    assert "spotray.dev/on-demand-fallback" not in gpu_node_pool(SPOT, "gpu")["spec"]["template"]["metadata"]["labels"]


def test_every_chart_value_set_exists_in_the_pinned_chart():
    assert KARPENTER.version == "1.14.1"
    values = chart_values("spotray-t", "https://api", "queue", {"release": "kube-prometheus-stack"})
    assert unknown_values_keys(values, chart_defaults("karpenter-1.14.1.values.yaml")) == []
    assert unknown_values_keys({"settings": {"clusterNam": "x"}}, chart_defaults("karpenter-1.14.1.values.yaml")) == [
        "settings.clusterNam"]


@pytest.fixture(scope="module")
def planned():
    import pulumi_kubernetes as k8s

    def program():
        provider = k8s.Provider("k", kubeconfig="{}")
        karpenter = Karpenter("kp", KarpenterArgs("spotray-t", "https://api", "us-west-2", (SPOT, FALLBACK), TAGS,
                                                  provider, depends_on=[], monitor_labels={"prometheus": "main"},
                                                  boundary=BOUNDARY))
        return {"pools": karpenter.node_pools, "queue": karpenter.queue_name}

    return run_mocked(program, "spotray", "t", "us-west-2")


def test_interruption_events_reach_the_queue_and_the_chart_is_told_its_name(planned):
    queue = planned.of_type("aws:sqs/queue:Queue")[0]
    rules = {r.name: json.loads(r.inputs["eventPattern"])
             for r in planned.of_type("aws:cloudwatch/eventRule:EventRule")}
    assert sorted(p["detail-type"][0] for p in rules.values()) == sorted(
        p["detail-type"][0] for p in INTERRUPTION_EVENTS.values())
    assert "EC2 Spot Instance Interruption Warning" in {p["detail-type"][0] for p in rules.values()}
    targets = planned.of_type("aws:cloudwatch/eventTarget:EventTarget")
    assert {t.inputs["rule"] for t in targets} == set(rules)
    assert {t.inputs["arn"] for t in targets} == {f"arn:aws:mock:us-west-2:123456789012:{queue.name}"}
    release = planned.of_type("kubernetes:helm.sh/v3:Release")[0].inputs
    assert (release["chart"], release["version"]) == ("oci://public.ecr.aws/karpenter/karpenter", "1.14.1")
    assert release["values"]["settings"]["interruptionQueue"] == queue.name


def test_the_chart_makes_a_service_monitor_with_the_label_the_stacks_prometheus_selects(planned):
    values = planned.of_type("kubernetes:helm.sh/v3:Release")[0].inputs["values"]
    assert values["serviceMonitor"] == {"enabled": True, "additionalLabels": {"prometheus": "main"}}
    assert chart_defaults("karpenter-1.14.1.values.yaml")["serviceMonitor"]["enabled"] is False  # off unless set


def test_the_controller_gets_pod_identity_and_may_pass_only_the_node_role(planned):
    association = planned.named("kp-controller")
    assoc = next(r for r in planned.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
                 if r.name == "kp-controller").inputs
    assert (assoc["namespace"], assoc["serviceAccount"]) == ("kube-system", "karpenter")
    policy = json.loads(next(r for r in planned.of_type("aws:iam/rolePolicy:RolePolicy")).inputs["policy"])
    passing = next(s for s in policy["Statement"] if s["Action"] == "iam:PassRole")
    assert passing["Resource"].endswith(":kp-node")
    assert association.parent == "kp"
    entry = planned.of_type("aws:eks/accessEntry:AccessEntry")[0].inputs
    assert entry["type"] == "EC2_LINUX" and entry["principalArn"].endswith(":kp-node")


def test_the_planned_custom_resources_validate_against_the_crds(planned):
    for resource, crd in (("kubernetes:karpenter.sh/v1:NodePool", NODEPOOL_CRD),
                          ("kubernetes:karpenter.k8s.aws/v1:EC2NodeClass", NODECLASS_CRD)):
        objects = planned.of_type(resource)
        assert objects
        for obj in objects:
            validate_custom_resource(obj.inputs, crd)
    node_class = planned.of_type("kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")[0].inputs["spec"]
    assert node_class["role"] == "kp-node"
    assert node_class["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": "spotray-t"}}]
