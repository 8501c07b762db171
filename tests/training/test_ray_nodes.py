"""Which nodes are gone, asked now: Ray's own mark, or a raylet that takes no connection."""

from __future__ import annotations

import socket

from spotray import ray_nodes
from spotray.ray_nodes import unreachable_nodes


def test_a_node_is_gone_when_ray_marked_it_dead_or_its_raylet_takes_no_connection(monkeypatch):
    with socket.create_server(("127.0.0.1", 0)) as listening:
        answering = listening.getsockname()[1]
        with socket.create_server(("127.0.0.1", 0)) as closed:
            refusing = closed.getsockname()[1]
        nodes = [{"NodeID": "alive", "Alive": True, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": answering},
                 {"NodeID": "killed", "Alive": True, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": refusing},
                 {"NodeID": "dead", "Alive": False, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": answering}]
        monkeypatch.setattr(ray_nodes.ray, "nodes", lambda: nodes)
        assert unreachable_nodes(["alive", "killed", "dead", "unknown"]) == ("dead", "killed", "unknown")
        assert unreachable_nodes(["alive"]) == ()


def test_a_drain_deadline_is_rays_in_seconds_or_a_spot_notices_length_where_ray_gives_none(monkeypatch):
    monkeypatch.setattr(ray_nodes.time, "time", lambda: 1000.0)
    assert ray_nodes.drain_deadline(1_234_500) == 1234.5
    assert ray_nodes.drain_deadline(0) == 1000.0 + ray_nodes.SPOT_NOTICE_S
