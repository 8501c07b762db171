"""``spotray plan``: the stack's program run under Pulumi mocks, in-process and offline, recording every
resource ``pulumi up`` would create: type, name, parent, inputs (secrets masked), protect/retain options. The
same record feeds the policy predicates and the infrastructure tests. Nothing here reaches AWS or Kubernetes."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime import mocks, rpc, settings

from infra.kernel.config import StackConfig
from infra.policies import Resource, violations
from infra.program import deploy
from spotray.errors import SpotrayError

SECRET = "[secret]"
# Inputs and outputs shown as [secret] by name, besides any value Pulumi itself marks secret.
_SECRET_KEYS = re.compile(r"^(kubeconfig|token|secret|.*password|.*secretkey|.*privatekey)$", re.IGNORECASE)
_SIG_KEY, _SECRET_SIG = rpc._special_sig_key, rpc._special_secret_sig


@dataclass
class PlannedResource:
    type: str
    name: str
    parent: str | None
    custom: bool
    inputs: dict
    protect: bool
    retain_on_delete: bool
    depends_on: list[str] = field(default_factory=list)  # names of the resources it waits for
    urn: str = ""
    parent_urn: str = ""

    def as_policy_resource(self) -> Resource:
        return Resource(self.type, self.name, self.inputs, self.protect, self.retain_on_delete)

    def to_dict(self) -> dict:
        return {"type": self.type, "name": self.name, "parent": self.parent, "inputs": self.inputs,
                **({"protect": True} if self.protect else {}),
                **({"retainOnDelete": True} if self.retain_on_delete else {})}


@dataclass
class Plan:
    stack: str
    resources: list[PlannedResource] = field(default_factory=list)
    outputs: dict = field(default_factory=dict)

    def of_type(self, type_: str) -> list[PlannedResource]:
        return [r for r in self.resources if r.type == type_]

    def named(self, name: str) -> PlannedResource:
        return next(r for r in self.resources if r.name == name)

    def violations(self, environment: str) -> dict[str, list[str]]:
        return violations([r.as_policy_resource() for r in self.resources if r.custom], environment)

    def to_dict(self, environment: str) -> dict:
        return {"stack": self.stack, "resources": [r.to_dict() for r in self.resources],
                "outputs": self.outputs, "policyViolations": self.violations(environment)}


class _Mocks(pulumi.runtime.Mocks):
    """Returns each resource's inputs as its state, plus the few computed outputs the program reads."""

    def __init__(self, region: str | None):
        self.region = region or "us-east-1"

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        name = args.inputs.get("name", args.name)
        state = {"arn": f"arn:aws:mock:{self.region}:123456789012:{args.name}", "name": name, **args.inputs}
        if args.typ == "aws:eks/cluster:Cluster":
            state.update(
                endpoint=f"https://{name}.eks.{self.region}.amazonaws.com",
                certificateAuthority={"data": "bW9jaw=="},
                identities=[{"oidcs": [{"issuer": f"https://oidc.eks.{self.region}.amazonaws.com/id/MOCK"}]}],
                vpcConfig={**args.inputs.get("vpcConfig", {}), "clusterSecurityGroupId": "sg-cluster"})
        elif args.typ == "aws:ecr/repository:Repository":
            state["repositoryUrl"] = f"123456789012.dkr.ecr.{self.region}.amazonaws.com/{name}"
        elif args.typ == "aws:sqs/queue:Queue":
            state["url"] = f"https://sqs.{self.region}.amazonaws.com/123456789012/{args.name}"
        elif args.typ == "aws:s3/bucket:Bucket":
            state["bucket"] = args.inputs.get("bucket", args.name)
        elif args.typ == "random:index/randomPassword:RandomPassword":
            state["result"] = f"generated-{args.name}"
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs):
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": "123456789012", "arn": "arn:aws:iam::123456789012:user/plan", "userId": "plan",
                    "id": "123456789012"}
        return {}


class _RecordingMonitor(mocks.MockMonitor):
    def __init__(self, mock: _Mocks, plan: Plan):
        super().__init__(mock)
        self.plan = plan
        self.names: dict[str, str] = {}

    def RegisterResource(self, request):  # noqa: N802 - the gRPC method's name
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.names[response.urn] = request.name
            self.plan.resources.append(PlannedResource(
                type=request.type, name=request.name, parent=self.names.get(request.parent),
                custom=bool(request.custom), inputs=_normalized(rpc.deserialize_properties(request.object)),
                protect=bool(request.protect), retain_on_delete=bool(request.retainOnDelete),
                depends_on=sorted(self.names.get(urn, urn) for urn in request.dependencies),
                urn=response.urn, parent_urn=request.parent if request.parent in self.names else ""))
        return response


def _normalized(value, key: str = ""):
    if isinstance(value, dict):
        if value.get(_SIG_KEY) == _SECRET_SIG:  # a secret map keeps its keys: which ones exist is no secret
            inner = value.get("value")
            return {k: SECRET for k in sorted(inner)} if isinstance(inner, dict) else SECRET
        return {k: _normalized(value[k], k) for k in sorted(value)}  # gRPC maps arrive in any order
    if isinstance(value, list):
        return [_normalized(v, key) for v in value]
    if key and _SECRET_KEYS.search(key) and value is not None:
        return SECRET
    return int(value) if isinstance(value, float) and value.is_integer() else value  # protobuf numbers are floats


def plan(cfg: StackConfig) -> Plan:
    """Runs the program for ``cfg`` under mocks and returns what it would create."""
    if cfg.platform == "existing" and not cfg.kubeconfig:  # nothing connects to it offline
        cfg = dataclasses.replace(cfg, kubeconfig="[kubeconfig: not read by plan]")
    return run_mocked(lambda: deploy(cfg), cfg.project, cfg.stack, cfg.region)


def run_mocked(build: Callable[[], dict], project: str, stack: str, region: str | None) -> Plan:
    """Runs ``build`` (which creates resources and returns outputs) under mocks and records what it created."""
    result = Plan(stack)
    settings.set_root_resource(None)  # type: ignore[arg-type]  # pulumi's annotation omits None; its ROOT is Optional
    monitor = _RecordingMonitor(_Mocks(region), result)
    pulumi.runtime.set_mocks(monitor.mocks, project=project, stack=stack, preview=True, monitor=monitor)

    @pulumi.runtime.test
    def run():
        outputs = {key: pulumi.Output.from_input(value) for key, value in build().items()}
        return pulumi.Output.from_input(_collect(outputs, result))

    run()
    result.resources.sort(key=lambda r: (r.parent or "", r.type, r.name))  # registration order is racy
    return result


async def _collect(outputs: dict[str, pulumi.Output], result: Plan) -> None:
    for key, output in outputs.items():
        value, secret = await output.future(), await output.is_secret()
        result.outputs[key] = SECRET if secret or _SECRET_KEYS.search(key) else _normalized(value)


# What a reviewer looks at first, per type: dotted paths into the inputs.
KEY_INPUTS = {
    "aws:eks/cluster:Cluster": ("version", "vpcConfig.endpointPublicAccess", "deletionProtection"),
    "aws:eks/nodeGroup:NodeGroup": ("capacityType", "instanceTypes", "scalingConfig"),
    "aws:ec2/vpc:Vpc": ("cidrBlock",),
    "aws:ec2/subnet:Subnet": ("availabilityZone", "cidrBlock"),
    "aws:s3/bucket:Bucket": ("bucket",),
    "aws:sqs/queue:Queue": ("messageRetentionSeconds",),
    "kubernetes:helm.sh/v3:Release": ("chart", "version"),
    "kubernetes:karpenter.sh/v1:NodePool": ("spec.template.spec.requirements", "spec.limits"),
}


def _key_inputs(r: PlannedResource) -> str:
    parts = []
    for path in KEY_INPUTS.get(r.type, ()):
        value: Any = r.inputs  # walks down to any JSON value
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if path.endswith("requirements") and isinstance(value, list):
            value = {q["key"].rsplit("/", 1)[-1]: q.get("values") for q in value}
        if value is not None:
            parts.append(f"{path.rsplit('.', 1)[-1]}={json.dumps(value, separators=(',', ':'))}")
    return " ".join(parts)


class PolicyViolations(SpotrayError):
    """The planned stack breaks a policy: exit code 1, as ``pulumi preview --policy-pack`` would fail."""

    exit_code = 1


def format_plan(result: Plan, environment: str) -> str:
    """One line per resource, indented under its parent, then the outputs and the policy check."""
    children: dict[str, list[PlannedResource]] = {}
    for r in result.resources:
        children.setdefault(r.parent_urn, []).append(r)
    lines = [f"stack {result.stack}: {sum(r.custom for r in result.resources)} resources in "
             f"{sum(not r.custom for r in result.resources)} components"]

    def walk(parent_urn: str, depth: int) -> None:
        for r in sorted(children.get(parent_urn, []), key=lambda r: (r.custom, r.type, r.name)):
            flags = "".join(f" [{f}]" for f, on in (("protect", r.protect), ("retain", r.retain_on_delete)) if on)
            summary = _key_inputs(r)
            lines.append(f"{'  ' * depth}+ {r.type}  {r.name}{flags}{'  ' + summary if summary else ''}")
            walk(r.urn, depth + 1)

    walk("", 1)
    lines.append("outputs:")
    lines += [f"  {k}: {v}" for k, v in result.outputs.items()]
    found = result.violations(environment)
    lines.append("policies: " + ("all pass" if not found else f"{sum(map(len, found.values()))} violation(s)"))
    lines += [f"  {name}: {message}" for name, messages in found.items() for message in messages]
    return "\n".join(lines)
