"""Which of a Ray cluster's nodes are gone, asked now (Ray itself marks a node dead only after about 15 s of failed
health checks), and a draining node's deadline."""

from __future__ import annotations

import socket
import time
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor

import ray

from spotray.config import SPOT_NOTICE_S

PROBE_TIMEOUT_S = 1.0


def drain_deadline(deadline_ms: int) -> float:
    """A draining node's deadline as Ray gives it (ms, 0: none given) in UNIX seconds; none given: a spot notice's
    length from now."""
    return deadline_ms / 1000 if deadline_ms else time.time() + SPOT_NOTICE_S


def unreachable_nodes(node_ids: Collection[str], timeout_s: float = PROBE_TIMEOUT_S) -> tuple[str, ...]:
    """The nodes among ``node_ids`` that are gone: marked dead by Ray, or whose raylet does not take a connection."""
    table = {node["NodeID"]: node for node in ray.nodes()}
    ids = sorted(set(node_ids))
    silent = set(silent_nodes([table[i] for i in ids if i in table and table[i]["Alive"]], timeout_s))
    return tuple(i for i in ids if i not in table or not table[i]["Alive"] or i in silent)


def silent_nodes(nodes: Sequence[dict], timeout_s: float = PROBE_TIMEOUT_S) -> tuple[str, ...]:
    """The IDs of ``nodes`` (as ``ray.nodes()`` lists them) whose raylet does not take a connection: a killed node's
    port refuses at once, a vanished machine's does not answer."""

    def silent(node: dict) -> bool:
        try:
            with socket.create_connection((node["NodeManagerAddress"], node["NodeManagerPort"]), timeout=timeout_s):
                return False
        except OSError:
            return True

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(nodes)))) as pool:
        return tuple(node["NodeID"] for node, quiet in zip(nodes, pool.map(silent, nodes), strict=True) if quiet)
