"""Infrastructure tests run the Pulumi program in-process under mocks (no CLI, AWS or Kubernetes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.config import StackConfig, load_stack_file
from infra.plan import Plan, plan

REPO = Path(__file__).resolve().parents[2]
STACKS = ("dev", "staging", "prod", "existing")


@pytest.fixture(scope="session")
def stack_plans() -> dict[str, tuple[StackConfig, Plan]]:
    """Every stack file of the repository, planned once."""
    plans = {}
    for stack in STACKS:
        cfg = load_stack_file(REPO, stack)
        plans[stack] = (cfg, plan(cfg))
    return plans


@pytest.fixture(scope="session")
def dev(stack_plans) -> StackConfig:
    return stack_plans["dev"][0]
