"""A real Ray cluster of several ``ray start`` nodes on this machine, whose nodes can be preempted.

Each node is its own process group, so a node can be SIGTERMed (Ray drains it with a deadline: a spot
interruption notice) or SIGKILLed with everything it runs (a preemption without notice).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spotray.accounts.node_records import CAPACITY_TYPE_LABEL
from spotray.driver.launch import RAY_TRAIN_POLLS_S
from spotray.errors import SpotrayError
from spotray.ray_local import free_port, state_api_env

_RAY = str(Path(sys.executable).with_name("ray"))
# The faults a drill injects are spot faults: its worker nodes say so, as a Karpenter spot node's pods would.
SPOT_LABEL = f"--labels={CAPACITY_TYPE_LABEL}=spot"
_STARTED = "Ray runtime started."  # what `ray start` logs once the GCS lists its node
_START_TIMED_OUT = "The current node timed out during startup."  # what it says when its raylet exited first


@dataclass
class Node:
    name: str
    proc: subprocess.Popen
    metrics_port: int  # where the node's metrics agent serves Prometheus metrics

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class LocalCluster:
    """Head (no CPUs, so training runs only on worker nodes) plus worker nodes of ``cpus_per_node`` CPUs."""

    log_dir: Path
    drain_timeout_s: float = 20.0
    cpus_per_node: int = 1
    env: dict = field(default_factory=dict)
    address: str = ""
    nodes: list[Node] = field(default_factory=list)
    auth_token: str = field(default_factory=lambda: secrets.token_hex(32))
    # Each node's own session directory, as on separate machines: a node's log monitor streams the output of the
    # workers in its directory, so a shared one would send every line to the driver once per node. Short, for Ray's
    # socket paths.
    temp_root: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    dashboard_port: int = field(default_factory=free_port)
    ports: set[int] = field(default_factory=set)  # every port handed to a node of this cluster
    stopped: bool = False

    def node_env(self) -> dict:
        """Environment of every node and client of this cluster (token auth, fast drain/poll settings)."""
        return {**os.environ, **self.env,
                "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.auth_token,
                "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(self.drain_timeout_s),
                **RAY_TRAIN_POLLS_S,  # the benches' plain Ray Train baselines poll as spotray does
                "RAY_USAGE_STATS_ENABLED": "0", **state_api_env(self.dashboard_port)}

    def start(self, workers: int) -> LocalCluster:
        """The head and ``workers`` nodes; a node that does not join stops the ones started (``with`` has not
        begun yet, so nothing else would)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        try:
            self._join("head", ["--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=true",
                                "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                                "--node-ip-address=127.0.0.1"])
            for _ in range(workers):
                self.add_node()
        except BaseException:
            self.stop()
            raise
        return self

    def add_node(self, wait: bool = True) -> Node:
        """``wait=False`` returns the node as started, and a thread sees it join (restarting it as ``_join`` does)
        by reading its log alone: a benchmark must not spend the CPU it measures on probing for it."""
        name, args = f"worker{len(self.nodes)}", [f"--address={self.address}", f"--num-cpus={self.cpus_per_node}",
                                                  "--node-ip-address=127.0.0.1", SPOT_LABEL]
        if wait:
            return self._join(name, args)
        node = self._spawn(name, args)
        threading.Thread(target=self._joined_in_background, args=(node, args), daemon=True,
                         name=f"join-{name}").start()
        return node

    def settled(self, timeout_s: float = 60.0) -> bool:
        """Whether, within ``timeout_s``, Ray lists as alive exactly the nodes whose processes run: a killed node is
        noticed by Ray's health checks seconds later, a drained one leaves once drained. Asked of the dashboard over
        HTTP, not from a driver of its own (see ``_wait_for``)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            running = sum(node.alive for node in self.nodes)
            if self._alive_in_ray() == running:
                return True
            time.sleep(0.5)
        return False

    def _alive_in_ray(self) -> int | None:
        request = urllib.request.Request(f"http://127.0.0.1:{self.dashboard_port}/api/v0/nodes?limit=1000",
                                         headers={"authorization": f"Bearer {self.auth_token}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                nodes = json.load(response)["data"]["result"]["result"]
        except (OSError, ValueError, KeyError):
            return None
        return sum(node["state"] == "ALIVE" for node in nodes)

    def preempt_with_notice(self, node: Node) -> None:
        """What Kubernetes does to a pod of a spot node that got its interruption notice."""
        os.kill(node.proc.pid, signal.SIGTERM)

    def kill(self, node: Node) -> None:
        """The node vanishes with no notice: raylet, object store and workers alike, at once."""
        for pid in [node.proc.pid, *_descendants(node.proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        node.proc.wait(timeout=30)

    def stop(self) -> None:
        self.stopped = True
        for node in reversed(list(self.nodes)):
            if node.alive:
                self.kill(node)
            _kill_group_leftovers(node.proc.pid)
        shutil.rmtree(self.temp_root, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _join(self, name: str, args: list[str], tries: int = 3) -> Node:
        """Starts a node and waits until it has joined (``_joined``)."""
        return self._joined(self._spawn(name, args), args, tries)

    def _joined(self, node: Node, args: list[str], tries: int = 3) -> Node:
        """Waits until ``node`` has joined, starting it again when Ray's start-up wait ended it. Ray 2.60 gives a
        node's dashboard agent a fixed 15 s to bind its port, then its raylet exits (not configurable); on a loaded
        2-core machine the agent's imports sometimes take longer. The kubelet restarts a pod whose raylet exited; this
        does the same."""
        try:
            self._wait_for(node)
        except SpotrayError as error:
            if tries == 1 or node.alive or _START_TIMED_OUT not in str(error) or self.stopped:
                raise
            self.nodes.remove(node)
            _kill_group_leftovers(node.proc.pid)  # its agents, still importing
            return self._join(node.name, args, tries - 1)
        return node

    def _joined_in_background(self, node: Node, args: list[str]) -> None:
        try:
            self._joined(node, args)
        except SpotrayError as error:
            if not self.stopped:  # a node stopped with its cluster did not fail to join
                print(f"spotray: {error}", file=sys.stderr, flush=True)

    def _spawn(self, name: str, args: list[str]) -> Node:
        log = open(self.log_dir / f"{name}.log", "a")  # noqa: SIM115 - lives as long as the node; keeps earlier tries
        # Real nodes have an address each; here every node's agent needs its own port, or a joining node's agent
        # spends seconds retrying the default one while the node comes up.
        metrics_port = self._new_port()
        args = [*args, f"--node-manager-port={self._new_port()}", f"--dashboard-agent-listen-port={self._new_port()}",
                f"--metrics-export-port={metrics_port}", f"--temp-dir={self.temp_root}/{len(self.nodes)}"]
        proc = subprocess.Popen([_RAY, "start", "--block", "--disable-usage-stats", *args], env=self.node_env(),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        node = Node(name, proc, metrics_port)
        self.nodes.append(node)
        if self.stopped:  # a background join's restart, after ``stop`` went through the nodes
            self.kill(node)
            raise SpotrayError(f"local Ray node {name}: its cluster was stopped")
        return node

    def _new_port(self) -> int:
        """A free port that no earlier node of this cluster had. Every node here has the same address, and Ray's GCS
        keeps its channel to a dead node's address and port, backing off after the refusals: a new node the OS gave
        that port was refused on it at once, failed 5 health checks and was marked dead 9 s after it joined."""
        port = free_port()
        while port in self.ports:
            port = free_port()
        self.ports.add(port)
        return port

    def _wait_for(self, node: Node, timeout_s: float = 90.0) -> None:
        """Until ``node`` has joined: ``ray start`` says so once the GCS lists the node, and ends if it does not
        within Ray's own 30 s. Read from its log: probing the cluster with a driver of its own (a Python process and
        a job a probe) loaded a 2-core machine enough to make a starting raylet miss those 30 s."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if _STARTED in _log(self.log_dir, node.name):
                return
            if not node.alive:
                break
            time.sleep(0.2)
        said = next((line.strip() for line in reversed(_log(self.log_dir, node.name).splitlines()) if line.strip()),
                    "no output")
        waited = "`ray start` ended" if not node.alive else f"not in {timeout_s:.0f}s"
        raise SpotrayError(f"local Ray node {node.name} did not join ({waited}: {said}); logs in {self.log_dir}")


class ReusedCluster:
    """One local cluster for drills that each take a worker node away and start a replacement, which leaves it whole:
    kept from one drill to the next while it is whole, replaced when it is not or when a drill failed on it (a
    driver may still run there). Starting a cluster costs more than most drills' training."""

    def __init__(self, log_dir: Path, workers: int = 2, drain_timeout_s: float = 20.0,
                 kind: Callable[..., LocalCluster] = LocalCluster):
        """``kind``: makes each cluster from its log folder and ``drain_timeout_s``."""
        self.log_dir, self.workers, self.drain_timeout_s, self.kind = log_dir, workers, drain_timeout_s, kind
        self._started = 0
        self._current: LocalCluster | None = None

    def get(self) -> LocalCluster:
        if self._current and not self._whole():
            self.discard()
        if not self._current:
            self._started += 1
            self._current = self.kind(self.log_dir / str(self._started),
                                      drain_timeout_s=self.drain_timeout_s).start(workers=self.workers)
        return self._current

    def discard(self) -> None:
        if self._current:
            self._current.stop()
            self._current = None

    def __enter__(self) -> ReusedCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.discard()

    def _whole(self) -> bool:
        """The head and ``workers`` worker nodes run, and Ray lists just those as alive (a killed node is noticed
        seconds later, a drained one leaves once drained): no drill's workers may be placed on a node that is gone."""
        cluster = self._current
        assert cluster is not None
        deadline = time.time() + cluster.drain_timeout_s + 10
        while _workers_running(cluster) > self.workers and time.time() < deadline:
            time.sleep(0.5)
        return cluster.nodes[0].alive and _workers_running(cluster) == self.workers and cluster.settled()


def given_or_own(clusters: ReusedCluster | None, log_dir: Path) -> contextlib.AbstractContextManager[ReusedCluster]:
    """``clusters`` when a caller shares its own (and stops it), else one of this run's, stopped when it ends."""
    return contextlib.nullcontext(clusters) if clusters else ReusedCluster(log_dir)


def _log(log_dir: Path, name: str) -> str:
    return (log_dir / f"{name}.log").read_text(errors="replace")


def _workers_running(cluster: LocalCluster) -> int:
    return sum(node.alive for node in cluster.nodes[1:])


def _descendants(pid: int) -> list[int]:
    """All processes below ``pid`` (Ray workers start their own sessions, so a process group is not enough)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, frontier = [], [pid]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found += kids
        frontier += kids
    return found


def _kill_group_leftovers(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
