"""Whether Ray has placed the worker group (a real local Ray), and the console's one line per wait for capacity."""

from __future__ import annotations

import io
import socket

import pytest
from ray.train import ScalingConfig
from ray.util.placement_group import placement_group, remove_placement_group

from spotray.config import ScalingSection
from spotray.driver import placement, progress
from spotray.driver.placement import Placement, answering_fit, group_fits, worker_group_placement, workers_that_fit
from spotray.ray_nodes import silent_nodes
from spotray.storage import resolve
from tests.console import line_kind


@pytest.mark.parametrize(("use_gpu", "resources"), [(False, {}), (True, {}), (False, {"CPU": 2, "memory": 0}),
                                                     (True, {"CPU": 8}), (True, {"CPU": 4, "GPU": 0.5})])
def test_a_workers_resources_are_what_ray_train_reserves_for_it(use_gpu, resources):
    ray_train = ScalingConfig(num_workers=2, use_gpu=use_gpu, resources_per_worker=resources or None)
    ours = ScalingSection(num_workers=2, use_gpu=use_gpu, resources_per_worker=resources).worker_resources
    assert ours == ray_train._resources_per_worker_not_none


@pytest.fixture
def raylet_ports():
    """A port that takes connections (a raylet that answers) and one that refuses them (a killed node's)."""
    with socket.create_server(("127.0.0.1", 0)) as listening:
        with socket.create_server(("127.0.0.1", 0)) as closed:
            refusing = closed.getsockname()[1]
        yield listening.getsockname()[1], refusing


def node(node_id: str, resources: dict, port: int, alive: bool = True) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Resources": resources, "NodeManagerAddress": "127.0.0.1",
            "NodeManagerPort": port}


def test_the_worker_group_fits_elsewhere_only_on_alive_nodes_that_are_not_being_preempted(monkeypatch, raylet_ports):
    answers, _ = raylet_ports
    scaling = ScalingSection(num_workers=2)  # of 1 CPU each
    nodes = [node("head", {"memory": 1e9}, answers), node("draining", {"CPU": 1.0}, answers),
             node("survivor", {"CPU": 1.0}, answers), node("gone", {"CPU": 4.0}, answers, alive=False)]
    monkeypatch.setattr(placement.ray, "nodes", lambda: nodes)
    assert not group_fits(scaling, excluding={"draining"})
    nodes.append(node("replacement", {"CPU": 1.0}, answers))
    assert group_fits(scaling, excluding={"draining"})


def test_a_node_ray_still_lists_as_alive_but_whose_raylet_refuses_holds_no_worker(monkeypatch, raylet_ports):
    answers, refuses = raylet_ports
    scaling = ScalingSection(num_workers=3)  # of 1 CPU each
    nodes = [node("survivor", {"CPU": 1.0}, answers), node("killed", {"CPU": 2.0}, refuses)]
    monkeypatch.setattr(placement.ray, "nodes", lambda: nodes)
    assert workers_that_fit(scaling, excluding=()) == 3  # Ray's list alone: the killed node for 15 s more
    assert not group_fits(scaling, excluding=())  # a small fit would end to grow, then wait for the killed node
    assert answering_fit(scaling) == (1, ("killed",))
    nodes.append(node("replacement", {"CPU": 2.0}, answers))
    assert group_fits(scaling, excluding=())
    assert answering_fit(scaling, excluding={"replacement"}) == (1, ("killed",))


def test_whether_more_workers_fit_reads_rays_list_once_and_asks_the_raylets_only_where_it_says_they_do(
        monkeypatch, raylet_ports):
    answers, refuses = raylet_ports
    scaling = ScalingSection(num_workers=4, min_workers=1)  # a fit of 1 asks whether 2 fit
    nodes = [node("survivor", {"CPU": 1.0}, answers)]
    reads, probed = [], []

    def listed() -> list[dict]:
        reads.append(len(nodes))
        return nodes

    def probe(asked: list[dict]) -> tuple[str, ...]:
        probed.append([n["NodeID"] for n in asked])
        return silent_nodes(asked)

    monkeypatch.setattr(placement.ray, "nodes", listed)
    monkeypatch.setattr(placement, "silent_nodes", probe)
    assert not placement.holds(scaling, 2) and not probed  # too few listed: no raylet is asked
    nodes.append(node("killed", {"CPU": 1.0}, refuses))  # Ray lists it as alive for 15 s more
    assert not placement.holds(scaling, 2)
    nodes.append(node("joined", {"CPU": 1.0}, answers))
    assert placement.holds(scaling, 2) and not placement.holds(scaling, 3)
    assert reads == [1, 2, 3, 3] and probed == [["survivor", "killed"]] + [["survivor", "killed", "joined"]] * 2
    assert not placement.holds(scaling, 5)  # never more than the group


def test_the_workers_that_fit_count_each_alive_nodes_whole_workers_but_the_lost_ones_up_to_the_group(monkeypatch):
    scaling = ScalingSection(num_workers=4, resources_per_worker={"CPU": 2, "GPU": 1})
    nodes = [{"NodeID": "big", "Alive": True, "Resources": {"CPU": 5.0, "GPU": 4.0}},  # 2: CPU-bound
             {"NodeID": "small", "Alive": True, "Resources": {"CPU": 1.0, "GPU": 1.0}},  # none
             {"NodeID": "lost", "Alive": True, "Resources": {"CPU": 2.0, "GPU": 1.0}},  # Ray has not noticed yet
             {"NodeID": "gone", "Alive": False, "Resources": {"CPU": 8.0, "GPU": 8.0}}]
    monkeypatch.setattr(placement.ray, "nodes", lambda: nodes)
    assert workers_that_fit(scaling, excluding={"lost"}) == 2
    assert workers_that_fit(scaling, excluding=()) == 3
    nodes.append({"NodeID": "more", "Alive": True, "Resources": {"CPU": 16.0, "GPU": 8.0}})
    assert workers_that_fit(scaling, excluding=()) == 4  # never above num_workers


def test_a_run_on_multi_gpu_nodes_fits_whole_nodes_worth_of_workers(monkeypatch):
    """The sizes its global batch was checked against: 12 GPUs free (a node and half of one) hold 8 workers."""
    scaling = ScalingSection(num_workers=16, use_gpu=True, min_workers=8, workers_per_node=8)
    nodes = [{"NodeID": "whole", "Alive": True, "Resources": {"GPU": 8.0}},
             {"NodeID": "half", "Alive": True, "Resources": {"GPU": 4.0}}]
    monkeypatch.setattr(placement.ray, "nodes", lambda: nodes)
    assert workers_that_fit(scaling, excluding=()) == 8


def test_the_worker_groups_placement_is_pending_without_the_resources_and_placed_with_them(ray_cluster):
    on_spot = ScalingSection(num_workers=2, resources_per_worker={"CPU": 1, "spot_gpu": 1})
    assert worker_group_placement(on_spot) is None  # no group yet
    pending = placement_group([on_spot.worker_resources] * 2)
    try:
        assert not pending.wait(1)
        placement = worker_group_placement(on_spot)
        assert placement is not None and not placement.placed
        assert placement.waiting_for.startswith("2 workers of 1 CPU, 1 spot_gpu each; the cluster has ")
        assert "0 spot_gpu free and no node big enough for one worker" in placement.waiting_for
    finally:
        remove_placement_group(pending)
    on_cpus = ScalingSection(num_workers=2, resources_per_worker={"CPU": 1})
    placed = placement_group([on_cpus.worker_resources] * 2)
    try:
        assert placed.wait(30)
        assert worker_group_placement(on_cpus) == Placement(True)
        assert worker_group_placement(on_spot) is None  # the removed group no longer counts
    finally:
        remove_placement_group(placed)


def test_the_console_says_once_per_wait_that_the_workers_wait_for_capacity(tmp_path, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    waiting = Placement(False, "2 workers of 1 GPU each; the cluster has 0 GPU free")
    answers: dict[str, Placement | None] = {"state": waiting}
    stream = io.StringIO()
    monitor = progress.ProgressMonitor(resolve(str(tmp_path / "attempts")), 1024, stream=stream,
                                       placement=lambda: answers["state"])

    def poll_for(seconds: float) -> list[str]:
        for _ in range(int(seconds / 2)):
            monitor.poll()
            now[0] += 2
        return stream.getvalue().splitlines()

    assert poll_for(progress.WAITING_AFTER_S - 2) == []  # a placement that takes seconds is not a wait
    lines = poll_for(60)
    assert lines == ["spotray: WAITING for capacity: 2 workers of 1 GPU each; the cluster has 0 GPU free; "
                     "training goes on when nodes join"]
    assert line_kind(lines[0]) == "waiting"
    answers["state"] = None  # between two of Ray Train's tries to place the group: the same wait
    poll_for(4)
    answers["state"] = waiting
    assert len(poll_for(60)) == 1
    answers["state"] = Placement(True)  # placed: the next wait is another one
    poll_for(2)
    answers["state"] = waiting
    assert len(poll_for(progress.WAITING_AFTER_S + 2)) == 2


def test_a_failing_placement_probe_says_nothing_and_the_monitor_goes_on(tmp_path):
    def lost_cluster():
        raise ConnectionError("GCS unreachable")

    stream = io.StringIO()
    progress.ProgressMonitor(resolve(str(tmp_path / "attempts")), 1024, stream=stream, placement=lost_cluster).poll()
    assert stream.getvalue() == ""
