"""A small evaluator of a principal's identity policies under its permissions boundary, for the offline checks of the
deploy role: no maintained Python library evaluates identity policies, a boundary and conditions together.

It follows the IAM User Guide's pages "Policy evaluation logic" and "Permissions boundaries for IAM entities", for a
principal acting in its own account: an explicit Deny in any of its policies wins; else the request is allowed only
if an identity policy allows it and, where the principal has a boundary, the boundary allows it too; anything else is
an implicit deny. A statement applies when its Action (or NotAction) and Resource (or NotResource) match, with ``*``
and ``?`` wildcards (actions case-insensitively), and every condition holds. Condition keys are looked up
case-insensitively. A key missing from the request fails a positive operator and passes a negated one; ``...IfExists``
and ``ForAllValues:`` pass on a missing key, ``ForAnyValue:`` fails. An operator outside ``OPERATORS`` raises, so no
policy is judged by guesswork. Not modelled: resource-based policies, SCPs, session policies, policy variables, and
the numeric, date and IP operators.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

ALLOW, EXPLICIT_DENY, IMPLICIT_DENY = "Allow", "ExplicitDeny", "ImplicitDeny"
Context = Mapping[str, str | Sequence[str]]


@cache
def _pattern(glob: str, ignore_case: bool) -> re.Pattern[str]:
    regex = re.escape(glob).replace(r"\*", ".*").replace(r"\?", ".")
    return re.compile(regex, re.IGNORECASE if ignore_case else 0)


def matches(glob: str, value: str, ignore_case: bool = False) -> bool:
    """IAM's wildcard match: ``*`` any run of characters (``/`` and ``:`` included), ``?`` one character."""
    return _pattern(glob, ignore_case).fullmatch(value) is not None


def _string_equals_ignore_case(value: str, wanted: str) -> bool:
    return value.lower() == wanted.lower()


def _bool(value: str, wanted: str) -> bool:
    return value.lower() == str(wanted).lower()


# Each positive operator: does the request's value match one value of the policy? ArnEquals takes wildcards as
# ArnLike does.
OPERATORS: dict[str, Callable[[str, str], bool]] = {
    "StringEquals": lambda value, wanted: value == wanted,
    "StringEqualsIgnoreCase": _string_equals_ignore_case,
    "StringLike": lambda value, wanted: matches(wanted, value),
    "ArnEquals": lambda value, wanted: matches(wanted, value),
    "ArnLike": lambda value, wanted: matches(wanted, value),
    "Bool": _bool,
}
NEGATED = {"StringNotEquals": "StringEquals", "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
           "StringNotLike": "StringLike", "ArnNotEquals": "ArnEquals", "ArnNotLike": "ArnLike"}


@dataclass(frozen=True)
class Request:
    action: str
    resource: str  # an ARN, or "*" for an action that takes no resource
    context: Context = field(default_factory=dict)


def decide(request: Request, identity: Sequence[dict], boundary: dict | None = None) -> str:
    """ALLOW, EXPLICIT_DENY or IMPLICIT_DENY for ``request`` by a principal with the ``identity`` policies and the
    permissions ``boundary`` (None: it has none)."""
    context = {key.lower(): _values(value) for key, value in request.context.items()}
    policies = [*identity, *([boundary] if boundary is not None else [])]
    if any(_applies(s, request, context) for s in _statements(policies, "Deny")):
        return EXPLICIT_DENY
    granted = any(_applies(s, request, context) for s in _statements(identity, "Allow"))
    if boundary is not None:
        granted = granted and any(_applies(s, request, context) for s in _statements([boundary], "Allow"))
    return ALLOW if granted else IMPLICIT_DENY


def allowed(request: Request, identity: Sequence[dict], boundary: dict | None = None) -> bool:
    return decide(request, identity, boundary) == ALLOW


def _statements(policies: Sequence[dict], effect: str) -> Iterator[dict]:
    for policy in policies:
        yield from (s for s in _values(policy["Statement"]) if s["Effect"] == effect)


def _values(value) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]


def _applies(statement: dict, request: Request, context: dict[str, list]) -> bool:
    return (_element_matches(statement, "Action", request.action, ignore_case=True)
            and _element_matches(statement, "Resource", request.resource, ignore_case=False)
            and all(_holds(operator, key, wanted, context)
                    for operator, block in statement.get("Condition", {}).items()
                    for key, wanted in block.items()))


def _element_matches(statement: dict, element: str, value: str, ignore_case: bool) -> bool:
    """Action/NotAction, Resource/NotResource: a Not... element applies to everything it does not list."""
    if element in statement:
        return any(matches(glob, value, ignore_case) for glob in _values(statement[element]))
    return not any(matches(glob, value, ignore_case) for glob in _values(statement[f"Not{element}"]))


def _holds(operator: str, key: str, wanted, context: dict[str, list]) -> bool:
    qualifier, _, base = operator.rpartition(":")
    if_exists = base.endswith("IfExists")
    base = base.removesuffix("IfExists")
    present = key.lower() in context
    values = context.get(key.lower(), [])
    wanted = [str(w) for w in _values(wanted)]
    if base == "Null":
        (expected,) = wanted
        return (not present) == (expected.lower() == "true")
    negated = base in NEGATED
    if NEGATED.get(base, base) not in OPERATORS:
        raise ValueError(f"condition operator {operator} is not modelled")
    match = OPERATORS[NEGATED.get(base, base)]

    def holds_for(value: str) -> bool:
        hit = any(match(value, w) for w in wanted)
        return not hit if negated else hit

    if qualifier == "ForAllValues":
        return all(holds_for(v) for v in values)
    if qualifier == "ForAnyValue":
        return any(holds_for(v) for v in values)
    if qualifier:
        raise ValueError(f"condition qualifier {qualifier} is not modelled")
    if not present:
        return if_exists or negated
    return all(holds_for(v) for v in values) if negated else any(holds_for(v) for v in values)
