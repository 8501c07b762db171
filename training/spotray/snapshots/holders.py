"""The snapshot holders: one Ray actor per node, pinned there, keeping the run's snapshot files in its own process
memory, so that they outlive the worker group but not the node. Not the object store or ``/dev/shm``: a local
drill's nodes share those, and a copy there would survive the kill it is meant to lose.

Each holder is detached and named after the run and its node, so that every attempt of one driver finds the same
holders; the driver removes them when it starts and when it ends (``remove_holders``)."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

import pyarrow.fs as pafs
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from spotray.accounts.node_records import NODE_NAME_ENV
from spotray.checkpoints.dcp import COMMIT_MARKER, METADATA, all_gather_objects
from spotray.ray_nodes import unreachable_nodes
from spotray.snapshots.memfs import HolderFileSystem, HolderFull, HolderGone, HolderRing, ring_order, under
from spotray.storage import Location

log = logging.getLogger(__name__)

NAMESPACE = "spotray"
CALL_TIMEOUT_S = 60.0
NODE_CHECK_S = 1.0  # while a call waits: how often its node is asked whether it is gone
ROOM_SHARE = 0.5  # of the memory the node's processes may still take, at most, for one run's snapshots
EVERYWHERE = frozenset({METADATA, COMMIT_MARKER})  # what a snapshot holds, on every node: a survivor can list it
HOLDER_NODE_CHARS = 12  # of a Ray node id, naming its holder in lines and rings


@ray.remote(num_cpus=0, max_restarts=0)
class SnapshotHolder:
    """One node's snapshot files: path -> bytes, within ``cap`` bytes (``put`` refuses beyond it)."""

    def __init__(self, max_bytes: int | None):
        room = int(node_room_bytes() * ROOM_SHARE)
        self.cap = room if max_bytes is None else min(room, max_bytes)
        self.files: dict[str, bytes] = {}

    def refusal(self, path: str, nbytes: int) -> str | None:
        """Why a file of ``nbytes`` would be refused (asked before it is sent: a refused one never takes memory
        here), or None."""
        return refusal(sum(len(v) for k, v in self.files.items() if k != path), nbytes, self.cap, node_room_bytes())

    def put(self, path: str, data: bytes) -> str | None:
        """None, or why the file was refused."""
        refused = self.refusal(path, len(data))
        if refused is None:
            self.files[path] = data
        return refused

    def get(self, path: str) -> bytes | None:
        return self.files.get(path)

    def sizes(self, prefix: str) -> dict[str, int]:
        return {key: len(data) for key, data in self.files.items() if under(key, prefix)}

    def delete(self, prefix: str) -> None:
        for key in [key for key in self.files if under(key, prefix)]:
            del self.files[key]

    def move(self, src: str, dest: str) -> None:
        for key in [key for key in self.files if under(key, src)]:
            self.files[dest + key[len(src):]] = self.files.pop(key)

    def usage(self) -> tuple[int, int]:
        """Bytes held, and the cap."""
        return sum(len(v) for v in self.files.values()), self.cap


def refusal(used: int, nbytes: int, cap: int, room: int) -> str | None:
    """Why a holder with ``used`` of its ``cap`` bytes refuses ``nbytes`` more while its node has ``room`` left, or
    None. The room is read at every file: the training processes on the node may have grown since the holder began."""
    if used + nbytes > cap:
        return f"no room for {nbytes / 1e6:.1f} MB more: {used / 1e6:.1f} MB of {cap / 1e6:.1f} MB held"
    if nbytes > room * ROOM_SHARE:
        return (f"no room for {nbytes / 1e6:.1f} MB more: the node has {room / 1e6:.1f} MB left, and snapshots "
                f"may take at most {ROOM_SHARE:.0%} of it")
    return None


class RayHolder:
    """``memfs.Holder`` over one node's holder actor."""

    def __init__(self, actor, node_id: str):
        self.actor, self.node_id, self.node = actor, node_id, node_id[:HOLDER_NODE_CHARS]

    def put(self, path: str, data: bytes) -> None:
        refused = self._call(self.actor.refusal, path, len(data)) or self._call(self.actor.put, path, data)
        if refused:
            raise HolderFull(self.node, f"the snapshot holder on node {self.node} refused {path}: {refused}")

    def get(self, path: str) -> bytes | None:
        return self._call(self.actor.get, path)

    def sizes(self, prefix: str) -> dict[str, int]:
        return self._call(self.actor.sizes, prefix)

    def delete(self, prefix: str) -> None:
        self._call(self.actor.delete, prefix)

    def move(self, src: str, dest: str) -> None:
        self._call(self.actor.move, src, dest)

    def usage(self) -> tuple[int, int]:
        held, cap = self._call(self.actor.usage)
        return held, cap

    def _call(self, method, *args):
        """The call's answer; HolderGone as soon as the holder's node is gone (a snapshot copy to a killed node would
        otherwise wait until Ray marks it dead, and the survivors with it), or after ``CALL_TIMEOUT_S``."""
        ref, deadline = method.remote(*args), time.monotonic() + CALL_TIMEOUT_S
        try:
            while not ray.wait([ref], timeout=NODE_CHECK_S)[0]:
                if unreachable_nodes([self.node_id]):
                    raise HolderGone(f"the snapshot holder on node {self.node} did not answer: its node is gone")
                if time.monotonic() > deadline:
                    raise HolderGone(f"the snapshot holder on node {self.node} did not answer in {CALL_TIMEOUT_S:g}s")
            return ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            raise HolderGone(f"the snapshot holder on node {self.node} did not answer: {exc}") from exc


def holder_prefix(run_url: str) -> str:
    return f"snapshot-{hashlib.sha1(run_url.encode()).hexdigest()[:12]}-"


def node_holder(run_url: str, node_id: str, max_bytes: int | None) -> RayHolder:
    """The run's holder on ``node_id``, started there where it is not running yet."""
    actor = SnapshotHolder.options(  # type: ignore[attr-defined]  # ray.remote's class gains .options
        name=holder_prefix(run_url) + node_id, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(max_bytes)
    return RayHolder(actor, node_id)


def snapshot_root(run_url: str, max_bytes: int | None) -> Location:
    """This rank's view of the run's snapshot memory: a holder on each node of the worker group, each rank's files on
    its own node and the next in the ring on another machine (a collective over the worker group). A Ray node's
    machine is its pod's Kubernetes node (``NODE_NAME_ENV``), where pods share one; elsewhere the node itself."""
    node = ray.get_runtime_context().get_node_id()
    machines = dict(all_gather_objects((node, os.environ.get(NODE_NAME_ENV) or node), None))
    nodes = ring_order(machines)
    ring = HolderRing([node_holder(run_url, n, max_bytes) for n in nodes], nodes.index(node), EVERYWHERE,
                      {node_id[:HOLDER_NODE_CHARS]: machine for node_id, machine in machines.items()})
    key = holder_prefix(run_url).rstrip("-")
    return Location(f"snapshot://{key}", pafs.PyFileSystem(HolderFileSystem(ring)), key)


def remove_holders(run_url: str) -> int:
    """Ends the run's holders, wherever they are, and returns how many once their names are free: an attempt
    started right after must start new holders, never find one that is being killed."""
    names = _holder_names(run_url)
    for name in names:
        try:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE))
        except ValueError:  # gone meanwhile
            continue
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while _holder_names(run_url) and time.monotonic() < deadline:
        time.sleep(0.1)
    return len(names)


def _holder_names(run_url: str) -> list[str]:
    prefix = holder_prefix(run_url)
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a.get("namespace") == NAMESPACE and a["name"].startswith(prefix)]


def node_room_bytes() -> int:
    """Memory this node's processes may still take: the cgroup's limit less its use where it has one (a pod's),
    and never more than the host's available memory."""
    available = _meminfo_available()
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 1 << 60:
            return max(0, min(available, limit - usage))
    return available


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable")
