"""CrossGuard policy pack: ``pulumi preview --policy-pack policy/``. Each policy is a predicate of
``infra/policies.py``, the same ones pytest applies to the mocked resource graph."""

import sys
from pathlib import Path

from pulumi_policy import EnforcementLevel, PolicyPack, StackValidationPolicy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the program's packages

from infra.kernel.config import NAMESPACE  # noqa: E402
from infra.policies import POLICIES, Policy, Resource  # noqa: E402


def _environment(resources: list[Resource]) -> str:
    """The stack's environment, from the tag every taggable resource carries."""
    return next((r.props["tags"][f"{NAMESPACE}:environment"] for r in resources
                 if f"{NAMESPACE}:environment" in (r.props.get("tags") or {})), "")


def _validator(policy: Policy):
    def validate(args, report_violation) -> None:
        # The engine does not show retainOnDelete to policy packs: protect is what can be checked here.
        resources = [Resource(r.resource_type, r.name, dict(r.props), bool(r.opts.protect), True)
                     for r in args.resources]
        for message in policy.check(resources, _environment(resources)):
            report_violation(message)

    return validate


PolicyPack(
    name="spotray",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=[StackValidationPolicy(name=p.name, description=p.description, validate=_validator(p))
              for p in POLICIES],
)
