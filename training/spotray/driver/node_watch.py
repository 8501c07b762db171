"""The driver's watch on the nodes the run holds, at every progress poll: new nodes are looked up and priced
(``NodeRecorder``), and a node found lost ends the attempt that held it (``accounts.endings``), with the evidence:

- off Kubernetes, a node is named after its Ray node (``node_records.this_node``), and Ray's node table gives a dead
  node's reason, kept by the GCS until the head goes; its capacity type is its Ray label
  ``karpenter.sh/capacity-type`` where it carries one (the drills' nodes are spot), else the configured one;
- on Kubernetes, a node is the Kubernetes node, listed every ``KUBERNETES_EVERY_S`` with the head's read-only
  service account: a node seen before that is gone from the list has vanished, with its labels' capacity type and
  the taints it had last (Karpenter's ``karpenter.sh/disrupted``, for one)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from spotray.accounts import endings, goodput, ledger
from spotray.accounts.node_records import (
    CAPACITY_TYPE_LABEL,
    NodeRecorder,
    in_kubernetes,
    kubernetes_nodes,
    ray_node_name,
    taint_keys,
)
from spotray.storage import Location

log = logging.getLogger(__name__)

EVIDENCE_AT_END_S = 30.0  # the most a finished run waits for Ray to mark dead a node it lost in its last seconds
ATTRIBUTE_WITHIN_S = 60.0  # a loss seen this long after the next attempt started is not what ended the attempt
KUBERNETES_EVERY_S = 10.0  # one list of the cluster's nodes
VANISHED = "vanished from Kubernetes"


@dataclass(frozen=True)
class RayNode:
    alive: bool
    death_reason: str | None  # Ray's NodeDeathInfo reason, e.g. UNEXPECTED_TERMINATION or AUTOSCALER_DRAIN_PREEMPTED
    capacity_type: str | None


def ray_nodes() -> dict[str, RayNode]:
    """Every node the GCS knows, dead ones included, by the name ``this_node`` gives it."""
    import ray
    from ray.core.generated.common_pb2 import NodeDeathInfo  # type: ignore[attr-defined]  # built at import time

    return {ray_node_name(node["NodeID"]): RayNode(
        node["Alive"], None if node["Alive"] else NodeDeathInfo.Reason.Name(node.get("DeathReason", 0)),
        (node.get("Labels") or {}).get(CAPACITY_TYPE_LABEL)) for node in ray.nodes()}


def _ray_nodes_or_none() -> dict[str, RayNode]:
    try:
        return ray_nodes()
    except Exception as exc:  # noqa: BLE001 - the cluster going away is reported by the run itself
        log.debug("cannot read Ray's nodes: %s", exc)
        return {}


class NodeWatch:
    def __init__(self, attempts_root: Location, recorder: NodeRecorder):
        self.root, self.recorder = attempts_root, recorder
        self._taints: dict[str, list[str]] = {}  # the held nodes Kubernetes listed, with their taints then
        self._listed: set[str] = set()  # every held node Kubernetes has listed: the ones whose vanishing is seen
        self._listed_at = 0.0

    def poll(self, attempts: list[ledger.AttemptInfo], ask_ray: bool = True) -> None:
        """``ask_ray`` False: the nodes' records only (the head may be gone, and Ray's calls would then block)."""
        held = {name for a in attempts for name in a.nodes}
        kubernetes = in_kubernetes()
        nodes = _ray_nodes_or_none() if ask_ray and not kubernetes else {}
        self.recorder.record(held, {name: n.capacity_type for name, n in nodes.items() if n.capacity_type})
        now = time.time()
        for name in sorted(held):  # each is in ``recorder.known`` now
            node = nodes.get(name)
            if node is not None and not node.alive and self.recorder.known[name].lost_at is None:
                reason = node.death_reason or "UNSPECIFIED"
                self._lost(attempts, name, reason, f"Ray says {reason}", now)
        if kubernetes and ask_ray and now >= self._listed_at + KUBERNETES_EVERY_S:
            self._listed_at = now
            self._kubernetes(attempts, held, now)

    def _kubernetes(self, attempts: list[ledger.AttemptInfo], held: set[str], now: float) -> None:
        listed = kubernetes_nodes()
        if listed is None:
            return
        for name in sorted(held):
            if name in listed:
                self._taints[name] = taint_keys(listed[name])
                self._listed.add(name)
            elif name in self._taints and self.recorder.known[name].lost_at is None:
                taints = self._taints.pop(name)
                self._lost(attempts, name, VANISHED, VANISHED + (
                    f" (taints when last listed: {', '.join(taints)})" if taints else ""), now)

    def gone(self, names: set[str]) -> set[str]:
        """Those of ``names`` that are lost, asked now, where the watch's next polls will record it: on Kubernetes,
        the ones it listed before that the cluster no longer lists (none where the list fails); elsewhere, the ones
        Ray lists dead or whose raylet takes no connection."""
        if not in_kubernetes():
            return lost_ray_nodes(names)
        listed = kubernetes_nodes()
        return set() if listed is None else {name for name in names if name in self._listed and name not in listed}

    def _lost(self, attempts: list[ledger.AttemptInfo], name: str, reason: str, evidence: str, now: float) -> None:
        facts = self.recorder.record_lost(name, reason, now)
        holders = [i for i, a in enumerate(attempts) if name in a.nodes]
        if not holders:
            return
        last = holders[-1]
        if last + 1 < len(attempts) and now - attempts[last + 1].started_at > ATTRIBUTE_WITHIN_S:
            return
        kind = endings.node_loss(facts.capacity_type, reason)
        endings.record(self.root, attempts[last].attempt_id, kind,
                       f"node {name} ({facts.capacity_type or 'capacity type unknown'}) lost: {evidence}")


def awaiting_evidence(root: Location, since: float, gone: Callable[[set[str]], set[str]]) -> list[str]:
    """The lost nodes whose evidence is not on record yet: held by an attempt that started at ``since`` or later and
    was followed by another, whose ending is not on record (``gone``: which of the named nodes are lost,
    ``NodeWatch.gone``)."""
    infos = [a for a in ledger.read_attempts(root) if a.started_at >= since][:-1]
    pending = {name for info in infos for name in info.nodes
               if goodput.attempt_record(root, info, steps=False).ending.kind == endings.UNKNOWN}
    return sorted(gone(pending)) if pending else []


def lost_ray_nodes(names: set[str]) -> set[str]:
    """Those of ``names`` that Ray lists and that are gone (``ray_nodes.unreachable_nodes``: marked dead, or their
    raylet takes no connection); none where Ray's node table cannot be read (the run's result stands without the
    evidence)."""
    import ray

    from spotray.ray_nodes import unreachable_nodes

    try:
        ids = [node["NodeID"] for node in ray.nodes() if ray_node_name(node["NodeID"]) in names]
        return {ray_node_name(node_id) for node_id in unreachable_nodes(ids)}
    except Exception as exc:  # noqa: BLE001 - Ray's errors when its head is going are not one type
        log.debug("cannot read Ray's nodes: %s", exc)
        return set()
