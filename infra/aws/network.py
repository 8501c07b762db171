"""VPC with a public and a private subnet per availability zone; NAT gateways (one, or one per zone);
subnet tags for load balancers and for Karpenter's subnet discovery."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.kernel.config import NetworkConfig
from infra.kernel.names import DISCOVERY_TAG


@dataclass(frozen=True)
class NetworkArgs:
    config: NetworkConfig
    cluster_name: str
    tags: dict[str, str]


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    private_subnet_ids: list[pulumi.Output[str]]
    public_subnet_ids: list[pulumi.Output[str]]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:infra:Network", name, None, opts)
        net, tags = args.config, args.tags
        child = pulumi.ResourceOptions(parent=self)
        cluster_tag = {f"kubernetes.io/cluster/{args.cluster_name}": "shared"}
        vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=net.vpc_cidr, enable_dns_hostnames=True, enable_dns_support=True,
                          tags={**tags, "Name": f"{args.cluster_name}-vpc"}, opts=child)
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags=tags, opts=child)
        public_rt = aws.ec2.RouteTable(f"{name}-public", vpc_id=vpc.id, tags={**tags, "Name": f"{name}-public"},
                                       routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": igw.id}], opts=child)
        public, private = [], []
        for i, az in enumerate(net.availability_zones):
            public.append(aws.ec2.Subnet(
                f"{name}-public-{az}", vpc_id=vpc.id, cidr_block=net.public_subnet_cidrs[i], availability_zone=az,
                map_public_ip_on_launch=False,
                tags={**tags, **cluster_tag, "Name": f"{name}-public-{az}", "kubernetes.io/role/elb": "1"},
                opts=child))
            aws.ec2.RouteTableAssociation(f"{name}-public-{az}", subnet_id=public[i].id, route_table_id=public_rt.id,
                                          opts=child)
            private.append(aws.ec2.Subnet(
                f"{name}-private-{az}", vpc_id=vpc.id, cidr_block=net.private_subnet_cidrs[i], availability_zone=az,
                tags={**tags, **cluster_tag, "Name": f"{name}-private-{az}", "kubernetes.io/role/internal-elb": "1",
                      DISCOVERY_TAG: args.cluster_name},
                opts=child))
        nat_zones = net.availability_zones if net.nat_gateways == "perAz" else net.availability_zones[:1]
        nats = []
        for i, az in enumerate(nat_zones):
            eip = aws.ec2.Eip(f"{name}-nat-{az}", domain="vpc", tags=tags, opts=child)
            nats.append(aws.ec2.NatGateway(f"{name}-nat-{az}", allocation_id=eip.id, subnet_id=public[i].id,
                                           tags={**tags, "Name": f"{name}-nat-{az}"},
                                           opts=pulumi.ResourceOptions(parent=self, depends_on=[igw])))
        for i, az in enumerate(net.availability_zones):
            nat = nats[i] if len(nats) > 1 else nats[0]
            rt = aws.ec2.RouteTable(f"{name}-private-{az}", vpc_id=vpc.id,
                                    tags={**tags, "Name": f"{name}-private-{az}"},
                                    routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}], opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-private-{az}", subnet_id=private[i].id, route_table_id=rt.id,
                                          opts=child)
        self.vpc_id = vpc.id
        self.private_subnet_ids = [s.id for s in private]
        self.public_subnet_ids = [s.id for s in public]
        self.register_outputs({"vpc_id": self.vpc_id, "private_subnet_ids": self.private_subnet_ids,
                               "public_subnet_ids": self.public_subnet_ids})
