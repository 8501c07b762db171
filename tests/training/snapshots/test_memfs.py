"""The snapshot holders' file system: where each file goes, where it is read from, and what a lost node takes."""

from __future__ import annotations

import pytest

from spotray.errors import NotFound, StorageError
from spotray.snapshots.memfs import ring_order
from tests.training.snapshots.holders import FakeHolder, snapshot_location


@pytest.fixture
def holders() -> list[FakeHolder]:
    return [FakeHolder(f"n{i}") for i in range(3)]


def test_a_file_goes_to_its_writers_node_and_the_next_and_what_lists_a_snapshot_everywhere(holders):
    root = snapshot_location(holders, own=2)
    root.child("step_1", "__2_0.distcp").write_bytes(b"shard")
    root.child("step_1", "COMMITTED.json").write_text("{}")
    root.child("step_1", ".metadata").write_bytes(b"meta")
    assert [sorted(h.files) for h in holders] == [
        ["run/step_1/.metadata", "run/step_1/COMMITTED.json", "run/step_1/__2_0.distcp"],  # node 2's next: node 0
        ["run/step_1/.metadata", "run/step_1/COMMITTED.json"],
        ["run/step_1/.metadata", "run/step_1/COMMITTED.json", "run/step_1/__2_0.distcp"]]


@pytest.mark.parametrize(("machines", "parts_held"), [
    ({"a1": "ip-a", "a2": "ip-a", "b1": "ip-b", "b2": "ip-b"}, [2, 2, 2, 2]),  # two pods on each of two instances
    ({"a1": "ip-a", "a2": "ip-a", "a3": "ip-a", "b1": "ip-b"}, [1, 4, 2, 1]),  # b1 must hold a copy of all of ip-a's
])
def test_a_parts_second_copy_is_on_another_machine_where_nodes_share_one(machines, parts_held):
    """On Kubernetes worker pods (Ray nodes) may share an instance, which a spot interruption takes whole: each part
    must have a copy off its own instance. By node id alone, a1's copy went to a2, and losing ip-a lost both."""
    order = ring_order(machines)
    holders = [FakeHolder(node) for node in order]
    for own, node in enumerate(order):
        snapshot_location(holders, own, machines).child("s", f"__{node}.distcp").write_bytes(b"part")
    for node in order:
        held_on = {machines[h.node] for h in holders if f"run/s/__{node}.distcp" in h.files}
        assert held_on == {"ip-a", "ip-b"}, (node, held_on)
    assert [len(h.files) for h in holders] == parts_held, order


def test_nodes_each_their_own_machine_keep_the_ring_of_node_ids():
    assert ring_order({"n2": "n2", "n0": "n0", "n1": "n1"}) == ["n0", "n1", "n2"]
    assert ring_order({"a1": "ip-a", "a2": "ip-a", "b1": "ip-b", "b2": "ip-b"}) == ["a1", "b1", "a2", "b2"]


def test_reads_come_from_the_writers_own_node_first_then_any_survivor(holders):
    root = snapshot_location(holders, own=1)
    shard = root.child("s", "__1_0.distcp")
    shard.write_bytes(b"abc")
    assert bytes(shard.read_view()) == b"abc" and holders[1].gets == ["run/s/__1_0.distcp"]
    holders[1].gone = True
    assert shard.read_bytes() == b"abc" and holders[2].gets == ["run/s/__1_0.distcp"]  # the ring's copy
    holders[2].gone = True
    with pytest.raises(NotFound):
        shard.read_bytes()


def test_it_is_a_location_like_any_other(holders):
    root = snapshot_location(holders)
    root.child("a", "x").write_text("1")
    root.child("a", "b", "y").write_text("2")
    assert root.list_names() == ["a"] and root.child("a").list_names() == ["b", "x"]
    assert root.child("a").list_dir_names() == ["b"] and root.child("a").is_dir() and root.child("a", "x").size() == 1
    root.child("a").move_tree_to(root.child("c"), last="x")
    assert not root.child("a").exists() and root.child("c", "b", "y").read_text() == "2"
    root.child("c").delete_tree()
    assert root.list_names() == [] and all(not h.files for h in holders)


def test_a_lost_node_has_nothing_and_stops_nothing(holders):
    root = snapshot_location(holders)
    root.child("a", "x").write_text("1")  # on nodes 0 and 1
    holders[0].gone = True
    assert root.list_names() == ["a"] and root.child("a", "x").read_text() == "1"
    root.child("a").delete_tree()
    assert not holders[1].files
    with pytest.raises(StorageError, match="cannot write snapshot://run/b/y: node n0 is gone"):
        root.child("b", "y").write_text("2")  # fails, as a write to unreachable storage does
