"""Whether Ray has placed the worker group, and what it waits for while it has not: a spot pool provisioning a node
leaves the run with nothing to show for minutes, and the console says why."""

from __future__ import annotations

from dataclasses import dataclass

import ray

from training.config import ScalingSection

_WAITING = {"PENDING", "RESCHEDULING"}


@dataclass(frozen=True)
class Placement:
    placed: bool
    waiting_for: str = ""  # while not placed: the group's needs against what the cluster has free


def worker_group_placement(scaling: ScalingSection) -> Placement | None:
    """The state of the placement group Ray Train reserves for ``scaling``'s workers (one bundle a worker); None
    while there is none (before the first attempt, between attempts)."""
    bundle = scaling.worker_resources
    states = {group["state"] for group in ray.util.placement_group_table().values()
              if len(group["bundles"]) == scaling.num_workers
              and all(_same(resources, bundle) for resources in group["bundles"].values())}
    if states & _WAITING:
        return Placement(False, _waiting_for(scaling))
    return Placement(True) if "CREATED" in states else None


def _same(resources: dict, bundle: dict) -> bool:
    return resources.keys() == bundle.keys() and all(abs(resources[k] - bundle[k]) < 1e-9 for k in bundle)


def _waiting_for(scaling: ScalingSection) -> str:
    bundle = scaling.worker_resources
    free = ray.available_resources()
    each = ", ".join(f"{amount:g} {name}" for name, amount in bundle.items())
    have = ", ".join(f"{free.get(name, 0.0):g} {name}" for name in bundle)
    line = f"{scaling.num_workers} workers of {each} each; the cluster has {have} free"
    if not any(all(node["Resources"].get(name, 0.0) >= amount for name, amount in bundle.items())
               for node in ray.nodes() if node["Alive"]):
        line += (" and no node big enough for one worker (an autoscaler must add one, or lower "
                 "scaling.resources_per_worker)")
    return line
