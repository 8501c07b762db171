from infra.aws.nodes import ADDONS, NODE_POLICIES, CoreNodes, CoreNodesArgs
from infra.kernel.config import CorePoolConfig
from infra.plan import run_mocked

TAGS = {"spotray:project": "spotray", "spotray:stack": "t"}
BOUNDARY = "arn:aws:iam::123456789012:policy/spotray-t-boundary"


def build():
    pool = CorePoolConfig(instance_types=("m7i.xlarge",), min_size=2, desired_size=3, max_size=5, disk_gib=80)
    return run_mocked(lambda: {"group": CoreNodes("core", CoreNodesArgs("spotray-t", pool, ["s-a", "s-b"],
                                                                        TAGS, BOUNDARY)).node_group.node_group_name},
                      "spotray", "t", "us-west-2")


def test_the_core_pool_is_an_on_demand_labelled_managed_node_group_in_private_subnets():
    plan = build()
    group = plan.of_type("aws:eks/nodeGroup:NodeGroup")[0].inputs
    assert group["capacityType"] == "ON_DEMAND"
    assert group["instanceTypes"] == ["m7i.xlarge"]
    assert group["scalingConfig"] == {"minSize": 2, "desiredSize": 3, "maxSize": 5}
    assert group["labels"] == {"spotray.dev/pool": "core"}
    assert (group["subnetIds"], group["diskSize"]) == (["s-a", "s-b"], 80)
    attached = {a.inputs["policyArn"].rsplit("/", 1)[1]
                for a in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment") if "node" in a.name}
    assert attached == set(NODE_POLICIES)


def test_core_add_ons_are_installed_and_ebs_csi_gets_its_role_through_pod_identity():
    addons = {a.inputs["addonName"]: a.inputs for a in build().of_type("aws:eks/addon:Addon")}
    assert set(addons) == set(ADDONS) >= {"vpc-cni", "coredns", "kube-proxy", "aws-ebs-csi-driver"}
    ebs = addons["aws-ebs-csi-driver"]["podIdentityAssociations"][0]
    assert ebs["serviceAccount"] == "ebs-csi-controller-sa" and ebs["roleArn"].endswith("core-ebs-csi")
