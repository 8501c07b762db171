"""What the Ray cluster can hold: whether Ray has placed the worker group and what it waits for while it has not (a
spot pool provisioning a node leaves the run with nothing to show for minutes, and the console says why), whether
the group fits on nodes other than those being preempted, and how many workers fit on nodes other than lost ones
(Ray lists a killed node as alive for about 15 s: a node counts only while its raylet answers)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import ray

from spotray.config import ScalingSection
from spotray.ray_nodes import silent_nodes

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
              if scaling.fewest_workers <= len(group["bundles"]) <= scaling.num_workers
              and all(_same(resources, bundle) for resources in group["bundles"].values())}
    if states & _WAITING:
        return Placement(False, _waiting_for(scaling))
    return Placement(True) if "CREATED" in states else None


def _same(resources: dict, bundle: dict) -> bool:
    return resources.keys() == bundle.keys() and all(abs(resources[k] - bundle[k]) < 1e-9 for k in bundle)


def _waiting_for(scaling: ScalingSection) -> str:
    bundle = scaling.worker_resources
    free = ray.available_resources()
    line = (f"{scaling.num_workers} workers of {resources_text(bundle)} each; the cluster has "
            f"{resources_text({name: free.get(name, 0.0) for name in bundle})} free")
    if not any(_holds(node["Resources"], bundle) for node in _alive_nodes()):
        line += (" and no node big enough for one worker (an autoscaler must add one, or lower "
                 "scaling.resources_per_worker)")
    return line


def group_fits(scaling: ScalingSection, excluding: Collection[str]) -> bool:
    """Whether the nodes that answer, but ``excluding``, hold the whole worker group."""
    return holds(scaling, scaling.num_workers, excluding)


def holds(scaling: ScalingSection, workers: int, excluding: Collection[str] = ()) -> bool:
    """Whether the nodes that answer, but ``excluding``, hold ``workers`` workers. Their raylets are asked only
    where Ray's list says the nodes do (a group that counted a lost node would wait for it)."""
    nodes = _alive_nodes(excluding)
    return _fit(scaling, nodes) >= workers and _answering_fit(scaling, nodes)[0] >= workers


def answering_fit(scaling: ScalingSection, excluding: Collection[str] = ()) -> tuple[int, tuple[str, ...]]:
    """How many workers the nodes that answer, but ``excluding``, hold, and the nodes Ray lists as alive that do
    not answer."""
    return _answering_fit(scaling, _alive_nodes(excluding))


def _answering_fit(scaling: ScalingSection, nodes: list[dict]) -> tuple[int, tuple[str, ...]]:
    silent = silent_nodes(nodes)
    return _fit(scaling, [node for node in nodes if node["NodeID"] not in silent]), silent


def workers_that_fit(scaling: ScalingSection, excluding: Collection[str]) -> int:
    """How many workers the alive nodes but ``excluding`` hold (their totals: a failed group's share on them frees
    up as it ends), at most ``num_workers``."""
    return _fit(scaling, _alive_nodes(excluding))


def _fit(scaling: ScalingSection, nodes: list[dict]) -> int:
    """Whole nodes' worth (``scaling.workers_per_node``): the sizes the global batch was checked against."""
    bundle = scaling.worker_resources
    fit = min(scaling.num_workers, sum(min(int(node["Resources"].get(name, 0.0) // amount)
                                           for name, amount in bundle.items()) for node in nodes))
    return fit - fit % scaling.workers_per_node


def _alive_nodes(excluding: Collection[str] = ()) -> list[dict]:
    """Each alive node as ``ray.nodes()`` lists it, but for the node IDs in ``excluding``."""
    return [node for node in ray.nodes() if node["Alive"] and node["NodeID"] not in excluding]


def _holds(resources: dict, needed: dict) -> bool:
    return all(resources.get(name, 0.0) >= amount for name, amount in needed.items())


def resources_text(resources: dict) -> str:
    """``{"CPU": 1, "GPU": 0.5}`` as "1 CPU, 0.5 GPU"."""
    return ", ".join(f"{amount:g} {name}" for name, amount in resources.items())
