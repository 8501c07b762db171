import dataclasses

import pytest

from infra.aws.network import Network, NetworkArgs
from infra.plan import run_mocked

TAGS = {"spotray:project": "spotray", "spotray:stack": "t"}


def build(dev, nat: str):
    net = dataclasses.replace(dev.network, nat_gateways=nat)
    return run_mocked(lambda: {"vpc": Network("net", NetworkArgs(net, "spotray-t", TAGS)).vpc_id},
                      "spotray", "t", dev.region)


@pytest.mark.parametrize(("nat", "gateways"), [("single", 1), ("perAz", 2)])
def test_one_nat_gateway_or_one_per_zone_and_every_private_route_goes_through_one(dev, nat, gateways):
    plan = build(dev, nat)
    nats = plan.of_type("aws:ec2/natGateway:NatGateway")
    assert len(nats) == gateways
    private_routes = [r for r in plan.of_type("aws:ec2/routeTable:RouteTable") if "private" in r.name]
    assert len(private_routes) == 2
    assert all(r.inputs["routes"][0]["natGatewayId"] in {f"{n.name}-id" for n in nats} for r in private_routes)


def test_subnets_per_zone_carry_load_balancer_and_karpenter_discovery_tags(dev):
    subnets = build(dev, "single").of_type("aws:ec2/subnet:Subnet")
    public = [s for s in subnets if "public" in s.name]
    private = [s for s in subnets if "private" in s.name]
    assert {s.inputs["availabilityZone"] for s in public} == {s.inputs["availabilityZone"] for s in private} == {
        "us-west-2a", "us-west-2b"}
    assert all(s.inputs["tags"]["kubernetes.io/role/elb"] == "1" for s in public)
    assert all(s.inputs["tags"]["kubernetes.io/role/internal-elb"] == "1" for s in private)
    assert all(s.inputs["tags"]["karpenter.sh/discovery"] == "spotray-t" for s in private)
    assert not any("karpenter.sh/discovery" in s.inputs["tags"] for s in public)  # GPU nodes stay private
    assert all(not s.inputs.get("mapPublicIpOnLaunch") for s in public)


def test_every_network_resource_is_a_child_of_the_component(dev):
    plan = build(dev, "single")
    assert {r.parent for r in plan.resources if r.custom} == {"net"}
