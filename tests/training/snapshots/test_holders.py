"""The holders as Ray actors: one per node and run, pinned there, refusing what its cap cannot hold before it is
sent, answering for the file system, and removed by the driver."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spotray.snapshots import holders
from spotray.snapshots.memfs import HolderGone


@pytest.mark.e2e  # the session's Ray
def test_a_holder_is_found_again_by_its_run_and_node_and_holds_within_its_cap(ray_cluster):
    import ray

    node = ray.get_runtime_context().get_node_id()
    holder = holders.node_holder("file:///runs/a", node, max_bytes=100)
    holder.put("s/x", b"1" * 60)
    again = holders.node_holder("file:///runs/a", node, max_bytes=10_000)  # the same actor: its cap stays
    assert again.get("s/x") == b"1" * 60 and again.sizes("s") == {"s/x": 60} and again.usage() == (60, 100)
    with pytest.raises(OSError, match="refused s/y: no room"):
        again.put("s/y", b"2" * 50)
    holders.node_holder("file:///runs/b", node, max_bytes=None).put("s/x", b"other run")
    assert holders.remove_holders("file:///runs/a") == 1
    with pytest.raises(HolderGone):
        holder.get("s/x")
    assert holders.node_holder("file:///runs/b", node, None).get("s/x") == b"other run"
    assert holders.remove_holders("file:///runs/b") == 1


def test_a_call_to_a_holder_whose_node_is_gone_fails_at_once_not_when_ray_marks_it_dead(monkeypatch):
    asked: list[list[str]] = []

    def unreachable(nodes: list[str]) -> tuple[str, ...]:
        asked.append(nodes)
        return tuple(nodes)

    monkeypatch.setattr(holders.ray, "wait", lambda refs, timeout: ([], refs))  # the call never answers
    monkeypatch.setattr(holders, "unreachable_nodes", unreachable)
    method = SimpleNamespace(remote=lambda *args: "ref")
    holder = holders.RayHolder(SimpleNamespace(get=method), "killed-node-id")
    with pytest.raises(HolderGone, match="node killed-node- did not answer: its node is gone"):
        holder.get("s/x")
    assert asked == [["killed-node-id"]]


def test_the_room_is_the_pods_where_it_has_a_limit_and_never_more_than_the_hosts(monkeypatch):
    files = {"/sys/fs/cgroup/memory.max": 8 << 30, "/sys/fs/cgroup/memory.current": 6 << 30}
    monkeypatch.setattr(holders, "_read_int", files.get)
    monkeypatch.setattr(holders, "_meminfo_available", lambda: 100 << 30)
    assert holders.node_room_bytes() == 2 << 30  # the pod's limit, not the host's free memory
    monkeypatch.setattr(holders, "_meminfo_available", lambda: 1 << 30)
    assert holders.node_room_bytes() == 1 << 30
    files.clear()  # no limit: the host's
    assert holders.node_room_bytes() == 1 << 30


MB = 1_000_000


@pytest.mark.parametrize(("used", "nbytes", "room", "refused"), [
    (0, 40 * MB, 100 * MB, None),
    (70 * MB, 40 * MB, 1000 * MB, "no room for 40.0 MB more: 70.0 MB of 100.0 MB held"),
    (0, 60 * MB, 100 * MB, "the node has 100.0 MB left, and snapshots may take at most 50% of it"),  # room shrank
])
def test_a_holder_refuses_past_its_cap_or_half_of_the_nodes_room_at_the_time(used, nbytes, room, refused):
    said = holders.refusal(used, nbytes, cap=100 * MB, room=room)
    assert said is None if refused is None else refused in str(said)
