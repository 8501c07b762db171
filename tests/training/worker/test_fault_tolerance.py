"""The fault-tolerance settings reach Ray Train, a notice too short for a save is reported, not obeyed, after
an emergency checkpoint the attempt moves on as soon as the worker group fits on other nodes, and an attempt that
could not start in a storage outage starts again once storage answers."""

from __future__ import annotations

import json
import logging
import time

import pytest
import torch

from spotray.accounts import endings, goodput, ledger
from spotray.checkpoints.dcp import Checkpointer, checkpoints_root, list_committed
from spotray.config import FaultToleranceSection
from spotray.driver import launch
from spotray.driver.failure_budget import FailureBudget
from spotray.errors import StorageError, TrainingFailed
from spotray.storage import Location, StorageOptions, resolve
from spotray.worker import cadence
from spotray.worker.attempt import WorkerEnv
from spotray.worker.loop import _survive_preemption
from spotray.worker.telemetry import RankZeroTelemetry
from tests.training.configs import make_config


def test_ray_train_polls_its_workers_and_the_drain_state_often_unless_the_operator_says_otherwise():
    environ = {"RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "3"}
    with launch.ray_train_polls(environ):
        assert environ == {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "3"}
    assert environ == {"RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "3"}  # a later plain Ray Train run gets Ray's own


class Box:
    def state_dict(self) -> dict:
        return {"t": torch.ones(4)}

    def load_state_dict(self, state: dict) -> None:
        pass


@pytest.mark.serial  # bounds wall-clock seconds
def test_a_deadline_too_short_for_a_save_is_logged_and_recorded_and_training_goes_on(tmp_path, caplog):
    root = resolve(str(tmp_path / "run"))
    checkpointer = Checkpointer(root, keep_last=3, async_save=False, rank=0, world_size=1)
    checkpointer.last_save_s = 10.0  # the last save took 10 s; the notice leaves 2
    attempts, info, writer = root.child("attempts"), ledger.AttemptInfo("a1", 0, 1, 4), ledger.RecordWriter()
    ledger.write_attempt(attempts, info)
    telemetry = RankZeroTelemetry(attempts_root=attempts, attempt=info, entered_at=time.time(), max_steps=100,
                                  tokens_per_step=512, flops_per_token=1e6, peak=None, run_name="ft", writer=writer)
    reports: list[dict] = []
    env = WorkerEnv(0, 1, torch.device("cpu"), reports.append)
    started = time.monotonic()
    with caplog.at_level(logging.INFO):
        _survive_preemption(time.time() + 2.0, 7, (checkpointer,), {"box": Box()}, env, telemetry)
    assert time.monotonic() - started < 2.0, "it must not wait for the node to go"
    writer.close(timeout_s=10)
    assert "too short for a checkpoint" in caplog.text
    status = goodput.read_status(attempts, "a1")
    assert status is not None
    notice = status["notice"]
    assert notice["step"] == 7 and notice["committed"] is False
    assert list_committed(checkpoints_root(root)) == [] and reports == []


def _notice_setup(tmp_path, capacity_elsewhere):
    root = resolve(str(tmp_path / "run"))
    checkpointer = Checkpointer(root, keep_last=3, async_save=False, rank=0, world_size=1)
    attempts, info, writer = root.child("attempts"), ledger.AttemptInfo("a1", 0, 1, 4), ledger.RecordWriter()
    ledger.write_attempt(attempts, info)
    telemetry = RankZeroTelemetry(attempts_root=attempts, attempt=info, entered_at=time.time(), max_steps=100,
                                  tokens_per_step=512, flops_per_token=1e6, peak=None, run_name="ft", writer=writer)
    env = WorkerEnv(0, 1, torch.device("cpu"), lambda _: None, capacity_elsewhere=capacity_elsewhere)
    return root, checkpointer, attempts, writer, telemetry, env


@pytest.mark.serial  # bounds wall-clock seconds
def test_after_its_emergency_checkpoint_the_attempt_moves_on_once_other_capacity_appears(tmp_path):
    answers = iter([False, False, True])  # the replacement node joins two seconds after the notice
    root, checkpointer, attempts, writer, telemetry, env = _notice_setup(tmp_path, lambda: next(answers))
    started = time.monotonic()
    moved = _survive_preemption(time.time() + 60, 7, (checkpointer,), {"box": Box()}, env, telemetry)
    waited = time.monotonic() - started
    writer.close(timeout_s=10)
    assert moved and 1.5 < waited < 10, waited  # not the 60 s to the deadline
    assert [c.step for c in list_committed(checkpoints_root(root))] == [7]
    status = goodput.read_status(attempts, "a1")
    assert status is not None
    assert status["notice"]["committed"] and status["moved_at"] >= status["notice"]["at"]


@pytest.mark.serial  # bounds wall-clock seconds
@pytest.mark.parametrize(("move_on", "asks"), [(True, (1, 2)), (False, (0, 0))])
def test_with_no_capacity_elsewhere_or_moving_off_it_waits_for_the_node_as_before(tmp_path, monkeypatch, move_on,
                                                                                   asks):
    monkeypatch.setattr(cadence, "PREEMPTION_WAIT_GRACE_S", 0.5)
    asked = []

    def no_capacity_elsewhere():
        asked.append(1)
        return False

    root, checkpointer, attempts, writer, telemetry, env = _notice_setup(tmp_path, no_capacity_elsewhere)
    moved = _survive_preemption(time.time() + 4.5, 7, (checkpointer,), {"box": Box()}, env, telemetry, move_on)
    writer.close(timeout_s=10)
    status = goodput.read_status(attempts, "a1")
    assert not moved and status is not None and status["moved_at"] is None
    assert asks[0] <= len(asked) <= asks[1], "asked until 3 s before the deadline, then no more collectives"
    assert [c.step for c in list_committed(checkpoints_root(root))] == [7]


@pytest.mark.parametrize("budget", [1, -1])
def test_each_move_on_a_notice_spends_the_preemption_budget_never_the_failure_budget(dataset_url, tmp_path,
                                                                                      monkeypatch, budget):
    attempts_moved = iter([True, True, False])  # two attempts move on a notice, the third finishes

    def fit(cfg, runtime_env, root, budget, start):
        attempts, moved = root.child("attempts"), next(attempts_moved)
        attempt_id = f"{len(ledger.read_attempts(attempts)) + 1:03d}"
        ledger.write_attempt(attempts, ledger.AttemptInfo(attempt_id, 0, 2, 4))
        if moved:
            now = time.time()
            notice = {"step": 5, "at": now, "committed": True}
            attempts.child(attempt_id, goodput.STATUS_FILE).write_text(json.dumps(
                {"notice": notice, "moved_at": now, "entered_at": now, "last_seen": now}))
        return launch.MOVED if moved else None

    monkeypatch.setattr(launch, "_fit", fit)
    monkeypatch.setattr(launch, "_ensure_ray", lambda *_: None)
    monkeypatch.setattr(launch, "summarize", lambda *_: {"finished": True})
    cfg = make_config(dataset_url, str(tmp_path), "moves", f"fault_tolerance.max_preemptions={budget}",
                      "fault_tolerance.max_failures=0")
    if budget == 1:
        with pytest.raises(TrainingFailed, match=r"restarted 2 times after spot interruptions \(the last: it moved "
                                                 r"on a preemption notice\), over fault_tolerance.max_preemptions=1; "
                                                 r"raise it"):
            launch.run(cfg)
    else:
        assert launch.run(cfg) == {"finished": True}


@pytest.mark.parametrize("errored_before", [False, True])
def test_a_fit_ray_could_not_repair_starts_again_with_the_workers_that_fit_charged_to_no_budget_and_again_as_it_grew(
        dataset_url, tmp_path, monkeypatch, errored_before):
    import io

    outcomes = iter([launch.ReplacementFailed("the actor died"), launch.GROWN, None])
    starts: list[launch.Start] = []

    def fit(cfg, runtime_env, root, budget, start):
        attempts = root.child("attempts")
        if errored_before and not starts:  # a failure Ray Train restarted within the fit, before the nodes were lost
            ledger.write_attempt(attempts, ledger.AttemptInfo("000", 0, start.workers, 4))
            attempts.child("000", goodput.STATUS_FILE).write_text(json.dumps(
                {"error": "FloatingPointError: loss is nan", "entered_at": time.time(), "last_seen": time.time()}))
        starts.append(start)
        ledger.write_attempt(attempts, ledger.AttemptInfo(f"{len(starts):03d}", 0, start.workers, 4))
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(launch, "_fit", fit)
    sizes = iter([(1, ("lost-a", "lost-b")), (2, ("lost-b",))])  # when it grew, Ray still listed lost-b
    monkeypatch.setattr(launch, "restart_size", lambda scaling: next(sizes))
    monkeypatch.setattr(launch, "_ensure_ray", lambda *_: None)
    monkeypatch.setattr(launch, "summarize", lambda *_: {"finished": True})
    cfg = make_config(dataset_url, str(tmp_path), "repair", "scaling.min_workers=1", "fault_tolerance.max_failures=0")
    console = io.StringIO()
    if errored_before:
        with pytest.raises(TrainingFailed, match=r"^training run 'repair' failed: the actor died$"):
            launch.run(cfg, console=console)
        assert starts == [launch.Start(2)]
        return
    assert launch.run(cfg, console=console) == {"finished": True}
    assert starts == [launch.Start(2), launch.Start(1, ("lost-a", "lost-b")), launch.Start(2, ("lost-b",))]
    assert ("spotray: Ray Train failed replacing a lost worker (the actor died): starting the workers again from the "
            "run's newest state, 1 of 2 workers (the ones that fit; growing back when capacity returns)\n"
            ) in console.getvalue()
    assert (endings.read(resolve(str(tmp_path)).child("repair", "attempts"), "001") or {}).get("kind") == "restarted"


def test_a_process_group_not_set_up_is_started_again_once_and_twice_in_a_row_ends_the_run(dataset_url, tmp_path,
                                                                                       monkeypatch):
    """Ray Train chooses the rendezvous port before its rank 0 binds it, and another process may take it meanwhile
    (a fresh clone's test run once failed so: EADDRINUSE); before, the run ended there."""
    import io

    import ray

    taken = torch.distributed.DistNetworkError("The server socket has failed to listen on any local network "
                                               "address. port: 36745, code: -98, name: EADDRINUSE")
    assert launch._process_group_failed(ray.train.ControllerError(taken))
    in_task = ray.exceptions.RayTaskError("_setup_torch_process_group", "Traceback ...", taken)
    assert launch._process_group_failed(ray.train.ControllerError(in_task))
    assert launch._process_group_failed(ray.train.ControllerError(in_task.as_instanceof_cause()))
    assert not launch._process_group_failed(ray.train.ControllerError(ValueError("loss is nan")))
    for outcomes, finishes in (([launch.GroupSetupFailed("EADDRINUSE"), None], True),
                               ([launch.GroupSetupFailed("EADDRINUSE")] * 2, False)):
        fits = iter(outcomes)

        def fit(cfg, runtime_env, root, budget, start, fits=fits):
            outcome = next(fits)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        monkeypatch.setattr(launch, "_fit", fit)
        monkeypatch.setattr(launch, "_ensure_ray", lambda *_: None)
        monkeypatch.setattr(launch, "summarize", lambda *_: {"finished": True})
        console = io.StringIO()
        cfg = make_config(dataset_url, str(tmp_path), f"setup-{finishes}")
        if finishes:
            assert launch.run(cfg, console=console) == {"finished": True}
            assert ("spotray: the workers' process group could not be set up (EADDRINUSE): starting the workers "
                    "again\n") in console.getvalue()
        else:
            with pytest.raises(TrainingFailed, match=r"could not be set up, twice in a row \(EADDRINUSE\)$"):
                launch.run(cfg, console=console)


def test_survivors_that_trained_to_the_end_while_ray_replaced_their_lost_workers_end_the_run(dataset_url, tmp_path,
                                                                                              monkeypatch):
    """A lone survivor may finish the run before Ray Train's controller fails to replace the workers lost beside it:
    the run is done, not started again, and its finished attempt is not marked restarted."""
    import io

    outcomes = iter([launch.ReplacementFailed("the actor died"), None])
    starts: list[launch.Start] = []

    def fit(cfg, runtime_env, root, budget, start):
        attempts = root.child("attempts")
        starts.append(start)
        ledger.write_attempt(attempts, ledger.AttemptInfo(f"{len(starts):03d}", 20, start.workers, 4))
        ledger.write_final(attempts, f"{len(starts):03d}", {"final_step": 40})
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(launch, "_fit", fit)
    monkeypatch.setattr(launch, "restart_size", lambda scaling: (1, ()))
    monkeypatch.setattr(launch, "_ensure_ray", lambda *_: None)
    monkeypatch.setattr(launch, "summarize", lambda *_: {"finished": True})
    cfg = make_config(dataset_url, str(tmp_path), "lone", "scaling.min_workers=1")
    console = io.StringIO()
    assert launch.run(cfg, console=console) == {"finished": True}
    assert starts == [launch.Start(2)] and "failed replacing" not in console.getvalue()
    assert endings.read(resolve(str(tmp_path)).child("lone", "attempts"), "001") is None


BUDGET = FailureBudget("/unused", StorageOptions(), FaultToleranceSection(), "outage", 0.0)  # _fit is the fake
START = launch.Start(2)


def _starts(monkeypatch, *outcomes) -> None:
    """``launch._fit`` ends with each outcome in turn: a value returned, or an exception raised."""
    queue = iter(outcomes)

    def fit(*_):
        outcome = next(queue)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(launch, "_fit", fit)
    monkeypatch.setattr(launch.time, "sleep", lambda _: None)


def _controller_did_not_start() -> Exception:
    import ray

    return ray.exceptions.RayActorError(actor_init_failed=True, error_msg="OSError: When testing for existence of "
                                        "bucket 'b': AWS Error NETWORK_CONNECTION during HeadBucket operation")


def test_an_attempt_that_could_not_start_in_a_storage_outage_starts_again_once_storage_answers(tmp_path,
                                                                                                monkeypatch):
    import io

    answers = iter([False, False, False, True])  # down as the start failed, and twice more: then back
    monkeypatch.setattr(Location, "reachable", lambda self: next(answers))
    _starts(monkeypatch, _controller_did_not_start(), launch.MOVED)
    cfg, console = make_config(str(tmp_path), str(tmp_path), "outage"), io.StringIO()
    assert launch._fit_through_storage_outages(cfg, cfg, None, resolve(str(tmp_path)), console, BUDGET,
                                                 START) == \
        launch.MOVED
    assert console.getvalue().count("\n") == 1 and "the attempt did not start (OSError: When testing" in \
        console.getvalue() and "starting it again once storage answers" in console.getvalue()


def test_a_start_failing_again_with_storage_up_or_an_outage_past_the_budget_ends_the_run(tmp_path, monkeypatch):
    import io

    import ray

    cfg = make_config(str(tmp_path), str(tmp_path), "outage", "checkpoint.save_failure_budget_s=0")
    root = resolve(str(tmp_path))
    _starts(monkeypatch, _controller_did_not_start(), _controller_did_not_start())  # storage answers: once more
    with pytest.raises(TrainingFailed, match=r"failed: Ray Train's controller did not start \(OSError: When"):
        launch._fit_through_storage_outages(cfg, cfg, None, root, io.StringIO(), BUDGET, START)
    monkeypatch.setattr(Location, "reachable", lambda self: False)
    _starts(monkeypatch, _controller_did_not_start())
    with pytest.raises(StorageError, match=r"stayed unreachable for checkpoint.save_failure_budget_s=0s; run the"):
        launch._fit_through_storage_outages(cfg, cfg, None, root, io.StringIO(), BUDGET, START)
    _starts(monkeypatch, ray.exceptions.RayActorError(error_msg="the controller's node died"))  # not at its start
    with pytest.raises(ray.exceptions.RayActorError):
        launch._fit_through_storage_outages(cfg, cfg, None, root, io.StringIO(), BUDGET, START)
