"""Going on with the survivors: the size Ray Train's restart of a failed worker group takes, decided from which of
its nodes still answer, and the restart kept off the others."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import ray
from ray.train.v2._internal.execution.controller.state import RestartingState, RunningState
from ray.train.v2._internal.execution.scaling_policy import ResizeDecision
from ray.train.v2.api.exceptions import ControllerError, WorkerGroupError

from spotray.config import ScalingSection
from spotray.driver import placement, resize
from spotray.driver.resize import ShrinkOnLoss

FAILED = RestartingState(WorkerGroupError("rank 0: gloo: Connection reset by peer", {}))
SHRINKS = ScalingSection(num_workers=4, min_workers=2)


def started(callback: ShrinkOnLoss, nodes=("node-a", "node-b", "node-c", "node-d")) -> ShrinkOnLoss:
    workers = [SimpleNamespace(metadata=SimpleNamespace(node_id=node)) for node in nodes]
    callback.after_worker_group_start(SimpleNamespace(get_workers=lambda: workers))
    return callback


def restart(callback: ShrinkOnLoss, state=FAILED) -> int:
    """The size of the restart Ray Train is about to make (its own decision: the configured size)."""
    callback.after_controller_state_update(None, state)
    decision = ResizeDecision(num_workers=4, resources_per_worker={"CPU": 1})
    callback.before_controller_execute_resize_decision(decision)
    return decision.num_workers


def node_c_lost(monkeypatch, fit: int) -> list[list[str]]:
    """node-c's raylet does not answer, and ``fit`` workers fit on the other nodes; the node lists asked about."""
    monkeypatch.setattr(resize, "workers_that_fit", lambda scaling, excluding: fit if excluding == ("node-c",) else 0)
    asked: list[list[str]] = []

    def unreachable(nodes) -> tuple[str, ...]:
        asked.append(sorted(nodes))
        return ("node-c",)

    monkeypatch.setattr(resize, "unreachable_nodes", unreachable)
    return asked


@pytest.mark.parametrize(("fit", "restart_with"), [(3, 3), (2, 2), (4, 4), (1, 4)])
def test_a_loss_the_whole_group_no_longer_fits_restarts_with_the_workers_that_do_down_to_min_workers(
        monkeypatch, fit, restart_with):
    """4 fit: a replacement is there; 1: too few, Ray's restart waits for capacity as without min_workers."""
    asked = node_c_lost(monkeypatch, fit)
    callback = started(ShrinkOnLoss(SHRINKS))
    assert restart(callback) == restart_with and callback.workers == restart_with
    assert asked == [["node-a", "node-b", "node-c", "node-d"]]
    assert callback.on_controller_start_worker_group(scaling_config=None, num_workers=restart_with) == {
        "ray.io/node-id": "!in(node-c)"}  # Ray may list the killed node as alive for 15 s more


def test_a_shrunk_group_grows_on_its_next_restart_where_the_whole_group_fits_and_keeps_off_every_lost_node(
        monkeypatch):
    lost = iter([("node-c",), ("node-a",)])
    monkeypatch.setattr(resize, "unreachable_nodes", lambda nodes: next(lost))
    fits = iter([3, 4])
    monkeypatch.setattr(resize, "workers_that_fit", lambda scaling, excluding: next(fits))
    callback = started(ShrinkOnLoss(SHRINKS))
    assert restart(callback) == 3
    started(callback, ("node-a", "node-b", "node-d"))
    assert restart(callback) == 4  # two replacements joined meanwhile
    assert callback.avoid == ("node-a", "node-c")


def test_a_group_grown_back_within_the_fit_shrinks_again_on_its_next_loss(monkeypatch):
    """The loop fails its shrunk group on purpose to grow back (every node answers: Ray's whole size); the restart
    after a later loss is sized from the grown group, not the shrunk one it replaced."""
    lost = iter([("node-c",), (), ("node-e",)])
    monkeypatch.setattr(resize, "unreachable_nodes", lambda nodes: next(lost))
    monkeypatch.setattr(resize, "workers_that_fit", lambda scaling, excluding: 3)
    callback = started(ShrinkOnLoss(SHRINKS))
    assert restart(callback) == 3
    started(callback, ("node-a", "node-b", "node-d"))
    assert restart(callback) == 4
    started(callback, ("node-a", "node-b", "node-d", "node-e"))
    assert restart(callback) == 3


def test_without_min_workers_a_lost_node_or_a_worker_groups_failure_nothing_changes(monkeypatch):
    monkeypatch.setattr(resize, "workers_that_fit", lambda scaling, excluding: 1)
    monkeypatch.setattr(resize, "unreachable_nodes", lambda nodes: ("node-c",))
    assert restart(started(ShrinkOnLoss(ScalingSection(num_workers=4)))) == 4
    shrinking = started(ShrinkOnLoss(ScalingSection(num_workers=4, min_workers=1)))
    assert restart(shrinking, RunningState()) == 4
    assert restart(shrinking, RestartingState(ControllerError(RuntimeError("start timed out")))) == 4
    monkeypatch.setattr(resize, "unreachable_nodes", lambda nodes: ())  # a worker's own error: every node answers
    assert restart(shrinking) == 4
    assert shrinking.on_controller_start_worker_group(scaling_config=None, num_workers=4) is None


def test_a_slow_answer_from_the_keeper_does_not_stop_the_end_of_a_run_that_waits_on_a_replacement(monkeypatch):
    """A timed-out call is asked again; only the keeper's loss ends the watch without ending the controller."""
    answers = iter([ray.exceptions.GetTimeoutError("keeper busy"), resize.END_AFTER_S + 1, "controller"])

    def get(ref, timeout):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    killed: list[str] = []
    monkeypatch.setattr(resize.ray, "get", get)
    monkeypatch.setattr(resize.ray, "kill", killed.append)
    call = SimpleNamespace(remote=lambda: None)
    keeper = SimpleNamespace(ended_for_s=call, get_controller=call)
    with resize.EndWithoutReplacement(keeper) as ender:
        deadline = time.monotonic() + 30
        while not killed and time.monotonic() < deadline:
            time.sleep(0.1)
    assert killed == ["controller"] and ender.ended


@pytest.mark.parametrize(("node_a_cpus", "size"), [(2, 3), (1, 2), (0, 4)])
def test_a_new_fit_after_lost_nodes_starts_with_the_workers_that_fit_down_to_min_workers_and_keeps_off_them(
        monkeypatch, node_a_cpus, size):
    """1 fits: too few, the new fit waits for capacity for the whole group."""
    nodes = [{"NodeID": "node-a", "Alive": True, "Resources": {"CPU": node_a_cpus}},
             {"NodeID": "node-b", "Alive": True, "Resources": {"CPU": 1}},
             {"NodeID": "node-c", "Alive": True, "Resources": {"CPU": 4}},  # Ray lists it as alive for 15 s more
             {"NodeID": "node-d", "Alive": False, "Resources": {"CPU": 4}}]
    monkeypatch.setattr(placement.ray, "nodes", lambda: nodes)
    asked: list[list[str]] = []

    def silent(nodes: list[dict]) -> tuple[str, ...]:
        asked.append([node["NodeID"] for node in nodes])
        return ("node-c",)

    monkeypatch.setattr(placement, "silent_nodes", silent)
    assert resize.restart_size(SHRINKS) == (size, ("node-c",))
    assert asked == [["node-a", "node-b", "node-c"]]
    assert resize.KeepOff(("node-c",)).on_controller_start_worker_group(scaling_config=None, num_workers=size) == {
        "ray.io/node-id": "!in(node-c)"}
    assert resize.KeepOff(()).on_controller_start_worker_group(scaling_config=None, num_workers=size) is None
