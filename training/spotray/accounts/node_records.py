"""Which nodes a run held, what they are and what they cost per hour: the ledger's ``nodes.json`` and ``cost.json``.

Every worker names its node when an attempt starts (``this_node``; rank 0 records the names in the attempt). The
driver looks each new node up once: on Kubernetes, read-only through the API with the pod's service account (the
labels Karpenter and EKS set), elsewhere from ``cost.node``; it prices the node then (``spotray.accounts.prices``),
so nothing calls a price source per step, and writes the facts to the ledger, where every figure of the run's cost
is read. A node the run lost is recorded with when and why (``driver/node_watch.py``).
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.request
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path

from spotray.config import CostSection, NodeSection
from spotray.storage import Location

log = logging.getLogger(__name__)

NODE_NAME_ENV = "SPOTRAY_NODE_NAME"  # the downward API's spec.nodeName, set on the RayJob's pods
NODES_FILE = "nodes.json"
COST_FILE = "cost.json"
_SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"  # also a Ray node label, where a node carries it
_LABELS = {"instance_type": "node.kubernetes.io/instance-type", "capacity_type": CAPACITY_TYPE_LABEL,
           "zone": "topology.kubernetes.io/zone"}
GPU_RESOURCE = "nvidia.com/gpu"


def this_node() -> str:
    """The node this process runs on: Kubernetes's node name, else Ray's node (a host may run several)."""
    name = os.environ.get(NODE_NAME_ENV)
    if name:
        return name
    import ray

    return ray_node_name(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else "local"


def ray_node_name(node_id: str) -> str:
    """A Ray node's name in the ledger, off Kubernetes."""
    return f"ray-{node_id[:12]}"


@dataclass(frozen=True)
class NodeFacts:
    """One node as the ledger keeps it; None is unknown. Prices in USD per hour, as priced when first seen."""

    name: str
    instance_type: str | None = None
    capacity_type: str | None = None
    zone: str | None = None
    created_at: float | None = None  # UNIX time
    gpus: int | None = None
    usd_per_hour: float | None = None  # at its own capacity type
    on_demand_usd_per_hour: float | None = None
    price_source: str | None = None
    lost_at: float | None = None  # when the driver saw it lost (UNIX time), with the reason given
    lost_reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def facts_from_node_object(node: dict) -> NodeFacts:
    """A ``v1.Node`` as the Kubernetes API returns it."""
    meta = node.get("metadata", {})
    labels = meta.get("labels") or {}
    created = meta.get("creationTimestamp")
    gpus = (node.get("status", {}).get("capacity") or {}).get(GPU_RESOURCE)
    return NodeFacts(meta.get("name", ""), **{key: labels.get(label) for key, label in _LABELS.items()},
                     created_at=datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp() if created else None,
                     gpus=int(gpus) if gpus is not None else None)


def in_kubernetes() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (_SERVICE_ACCOUNT / "token").exists()


def kubernetes_node(name: str, timeout_s: float = 5.0) -> NodeFacts | None:
    """GET the node with the pod's service account (its ClusterRole grants get and list on nodes, nothing else);
    None where it fails."""
    try:
        return facts_from_node_object(_kubernetes_get(f"/api/v1/nodes/{name}", timeout_s))
    except (OSError, ValueError) as exc:
        log.warning("cannot look up node %s (%s): its cost is unknown; the training pods' service account needs "
                    "get and list on nodes (ClusterRole spotray-node-reader)", name, str(exc)[:200])
        return None


def kubernetes_nodes(timeout_s: float = 10.0) -> dict[str, dict] | None:
    """Every node the cluster has now, by name (``v1.Node`` objects); None where the list fails."""
    try:
        listed = _kubernetes_get("/api/v1/nodes", timeout_s)
    except (OSError, ValueError) as exc:
        log.info("cannot list the nodes (%s): the ClusterRole spotray-node-reader grants list on nodes", exc)
        return None
    return {item["metadata"]["name"]: item for item in listed.get("items") or []}


def _kubernetes_get(path: str, timeout_s: float) -> dict:
    """Plain HTTPS: read-only GETs do not warrant the Kubernetes client in the training image."""
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    request = urllib.request.Request(f"https://{host}:{port}{path}", headers={
        "Authorization": f"Bearer {(_SERVICE_ACCOUNT / 'token').read_text().strip()}", "Accept": "application/json"})
    context = ssl.create_default_context(cafile=str(_SERVICE_ACCOUNT / "ca.crt"))
    with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
        return json.loads(response.read())


def taint_keys(node: dict) -> list[str]:
    return sorted(taint["key"] for taint in (node.get("spec") or {}).get("taints") or [] if taint.get("key"))


def configured_node(name: str, section: NodeSection) -> NodeFacts:
    return NodeFacts(name, section.instance_type, section.capacity_type, section.zone)


def priced(facts: NodeFacts, book, at: float) -> NodeFacts:
    """``facts`` with its prices from ``book`` (``spotray.accounts.prices.PriceBook``) at time ``at``."""
    if not facts.instance_type or not facts.capacity_type:
        return facts
    price = book.hourly(facts.instance_type, facts.capacity_type, facts.zone, at)
    on_demand = book.hourly(facts.instance_type, "on-demand", facts.zone, at)
    return NodeFacts(**{**facts.to_dict(), "usd_per_hour": price, "on_demand_usd_per_hour": on_demand,
                        "price_source": book.source(facts.instance_type, facts.capacity_type)})


def read_nodes(attempts_root: Location) -> dict[str, NodeFacts]:
    location = attempts_root.child(NODES_FILE)
    if not location.exists():
        return {}
    return {name: NodeFacts(**facts) for name, facts in json.loads(location.read_text()).items()}


def read_cost_settings(attempts_root: Location) -> dict:
    """What the driver recorded of ``cost``: example prices, warm spares and the head's facts (or {})."""
    location = attempts_root.child(COST_FILE)
    return json.loads(location.read_text()) if location.exists() else {}


class NodeRecorder:
    """The driver's side: the run's cost settings once, then each new node's facts as attempts name them."""

    def __init__(self, attempts_root: Location, cost: CostSection, book):
        self.root, self.cost, self.book = attempts_root, cost, book
        self.known = read_nodes(attempts_root)
        head, core = (None if section is None else priced(configured_node(name, section), book, time.time()).to_dict()
                      for name, section in (("head", cost.head), ("core", cost.core)))
        attempts_root.child(COST_FILE).write_text(json.dumps(
            {"example_prices": cost.example_prices, "warm_spares": cost.warm_spares, "head": head, "core": core,
             "core_nodes": cost.core_nodes}, sort_keys=True))

    def record(self, node_names: set[str], capacity_types: dict[str, str] | None = None) -> None:
        """Looks up the nodes not seen before; ``capacity_types``: what the nodes' labels in Ray say, where the
        configuration does not."""
        new = sorted(node_names - set(self.known))
        if not new:
            return
        for name in new:
            facts = kubernetes_node(name) if in_kubernetes() else None
            facts = facts or configured_node(name, self.cost.node)
            if facts.capacity_type is None and capacity_types and name in capacity_types:
                facts = replace(facts, capacity_type=capacity_types[name])
            self.known[name] = priced(facts, self.book, time.time())
        self._write()

    def record_lost(self, name: str, reason: str, at: float) -> NodeFacts:
        """A node the run held was lost (first report wins); returns its facts."""
        facts = self.known.get(name) or configured_node(name, self.cost.node)
        if facts.lost_at is None:
            self.known[name] = facts = replace(facts, lost_at=at, lost_reason=reason)
            self._write()
        return facts

    def _write(self) -> None:
        self.root.child(NODES_FILE).write_text(json.dumps({n: f.to_dict() for n, f in sorted(self.known.items())},
                                                          sort_keys=True))
