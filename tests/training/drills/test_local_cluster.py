"""The drills' local Ray cluster: a node has joined when ``ray start`` says so in its log, and one that does not
join is one line naming what ``ray start`` said last."""

from __future__ import annotations

import subprocess
import time
from typing import cast

import pytest

from spotray.drills import cluster as cluster_module
from spotray.drills.cluster import LocalCluster, Node
from spotray.errors import SpotrayError


def node_that_logged(cluster: LocalCluster, text: str, still_running: bool) -> Node:
    cluster.log_dir.mkdir(parents=True, exist_ok=True)
    (cluster.log_dir / "worker1.log").write_text(text)
    proc = subprocess.Popen(["sleep", "30" if still_running else "0"])
    if not still_running:
        proc.wait()
    return Node("worker1", proc, 0)


def test_a_node_has_joined_once_ray_start_logs_that_the_runtime_started(tmp_path):
    with LocalCluster(tmp_path / "logs") as cluster:
        node = node_that_logged(cluster, "INFO Local node IP: 127.0.0.1\nSUCC -- Ray runtime started.\n", True)
        cluster._wait_for(node, timeout_s=5)
        node.proc.kill()


@pytest.mark.parametrize(("still_running", "waited"), [(False, "`ray start` ended"), (True, "not in 1s")])
def test_a_node_that_does_not_join_is_one_line_with_what_ray_start_said_last(tmp_path, still_running, waited):
    with LocalCluster(tmp_path / "logs") as cluster, pytest.raises(SpotrayError) as caught:
        node = node_that_logged(cluster, "INFO Local node IP: 127.0.0.1\nException: The current node timed out "
                                         "during startup.\n\n", still_running)
        try:
            cluster._wait_for(node, timeout_s=1)
        finally:
            node.proc.kill()
    assert str(caught.value) == (f"local Ray node worker1 did not join ({waited}: Exception: The current node timed "
                                 f"out during startup.); logs in {tmp_path / 'logs'}")


def fake_ray_whose_first_start_says(line: str, tmp_path, monkeypatch) -> None:
    """A `ray start` that ends after ``line`` the first time and joins the second."""
    script = tmp_path / "ray"
    tried = tmp_path / "tried"
    script.write_text(f"#!/bin/sh\nif [ ! -e {tried} ]; then touch {tried}; echo '{line}'; exit 1; fi\n"
                      "echo 'Ray runtime started.'; exec sleep 60\n")
    script.chmod(0o755)
    monkeypatch.setattr(cluster_module, "_RAY", str(script))


def test_a_node_that_rays_start_up_wait_ended_is_started_again(tmp_path, monkeypatch):
    fake_ray_whose_first_start_says("Exception: The current node timed out during startup. This could happen because "
                                    "some of the raylet failed to startup or the GCS has become overloaded.",
                                    tmp_path, monkeypatch)
    with LocalCluster(tmp_path / "logs") as cluster:
        cluster.log_dir.mkdir()
        node = cluster.add_node()
        assert node.alive and cluster.nodes == [node]
        assert (tmp_path / "logs" / "worker0.log").read_text().count("\n") == 2, "both tries' output is kept"


def test_a_node_started_without_waiting_is_started_again_in_the_background(tmp_path, monkeypatch):
    """A bench starts the replacement node and does not wait for it; Ray's start-up wait may still end it."""
    fake_ray_whose_first_start_says("Exception: The current node timed out during startup.", tmp_path, monkeypatch)
    with LocalCluster(tmp_path / "logs") as cluster:
        cluster.log_dir.mkdir()
        first = cluster.add_node(wait=False)
        deadline = time.time() + 10
        while (first in cluster.nodes or not cluster.nodes) and time.time() < deadline:
            time.sleep(0.1)
        assert [node.name for node in cluster.nodes] == ["worker0"] and cluster.nodes[0] is not first
        assert cluster.nodes[0].alive and not first.alive


def test_a_node_that_fails_for_another_reason_is_not_started_again(tmp_path, monkeypatch):
    fake_ray_whose_first_start_says("Exception: Version mismatch", tmp_path, monkeypatch)
    with LocalCluster(tmp_path / "logs") as cluster, pytest.raises(SpotrayError, match="Version mismatch"):
        cluster.log_dir.mkdir()
        cluster.add_node()


def test_no_node_gets_a_port_an_earlier_node_of_its_cluster_had(tmp_path, monkeypatch):
    """The OS may hand a dead node's port to a new one; Ray's GCS would refuse the new node on its stale channel."""
    fake_ray_whose_first_start_says("Ray runtime started.", tmp_path, monkeypatch)
    offered = iter([41000, 41001, 41002, 41000, 41001, 41002, 41003, 41004, 41005])  # the OS reusing freed ports
    monkeypatch.setattr(cluster_module, "free_port", lambda: next(offered))
    with LocalCluster(tmp_path / "logs") as cluster:
        cluster.log_dir.mkdir()
        first, second = cluster.add_node(wait=False), cluster.add_node(wait=False)
        assert ports_of(first) == {41000, 41001, 41002} and ports_of(second) == {41003, 41004, 41005}


def ports_of(node: Node) -> set[int]:
    args = cast(list[str], node.proc.args)  # LocalCluster starts a node from a list of strings
    return {int(arg.split("=")[1]) for arg in args if "-port=" in arg}
