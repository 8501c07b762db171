"""Goodput accounting and interruption events from a hand-made ledger of three attempts."""

from __future__ import annotations

import io
import json
import threading
import time
from typing import Any

import pytest

from spotray.accounts import endings, goodput, ledger
from spotray.driver import progress
from spotray.driver.progress import ProgressMonitor
from spotray.storage import resolve
from spotray.worker.telemetry import RankZeroTelemetry
from tests.training.ledgers import write_attempt


@pytest.fixture
def run(tmp_path):
    """A: trains 1-50, drain notice at step 50 (t=1090). B: resumes at 50, trains to 80, and the driver sees its spot
    node lost (t=1200). C: resumes from the step-70 checkpoint and finishes at 100."""
    root = resolve(str(tmp_path / "attempts"))
    root.child("run.json").write_text(json.dumps({"started_at": 1000.0}))
    write_attempt(root, "a", 0, 50, {"entered_at": 1010.0, "startup_s": 5.0, "restore_s": 0.0,
                                     "checkpoint_save_s": 2.0, "drain_wait_s": 20.0, "first_step_at": 1016.0,
                                     "last_seen": 1110.0, "notice": {"step": 50, "at": 1090.0, "committed": True}})
    write_attempt(root, "b", 50, 80, {"entered_at": 1130.0, "startup_s": 4.0, "restore_s": 1.0,
                                      "first_step_at": 1140.0, "last_seen": 1200.0})
    endings.record(root, "b", endings.KILL, "node ray-b (spot) lost: Ray says UNEXPECTED_TERMINATION")
    write_attempt(root, "c", 70, 100, {"entered_at": 1215.0, "startup_s": 4.0, "restore_s": 1.0,
                                       "checkpoint_save_s": 1.0, "first_step_at": 1225.0, "last_seen": 1300.0})
    return root


def test_time_is_split_by_category_and_goodput_counts_only_kept_steps(run):
    account = goodput.account(run)
    assert account.total_s == 300.0
    s = account.seconds
    assert s["productive"] == 100.0  # steps 1-50 of A, 51-70 of B, 71-100 of C: one second each
    assert s["wasted"] == 10.0  # B's steps 71-80, trained again by C
    assert s["startup"] == 10.0 + 5 + 4 + 4  # driver -> first worker, then each attempt's start-up
    assert s["restore"] == 2.0 and s["checkpoint_save"] == 3.0
    assert s["waiting"] == 20.0 + (1130 - 1110) + (1215 - 1200)  # the drain, then the gaps between attempts
    assert s["other"] == pytest.approx(300 - sum(v for k, v in s.items() if k != "other"))
    assert account.goodput == pytest.approx(100 / 300)


def test_steps_past_where_the_next_attempt_resumed_leave_the_history_even_when_not_trained_again(run):
    """C resumed from step 70 and stopped at 75: B's steps 76-80 are not the model's history, they are wasted."""
    write_attempt(run, "c", 70, 75, {"entered_at": 1215.0, "first_step_at": 1225.0, "last_seen": 1300.0})
    history = ledger.lineage(run)
    assert list(history) == list(range(1, 76))
    assert {history[s].attempt_id for s in (50, 70, 71, 75)} == {"a", "b", "c"} and history[71].attempt_id == "c"
    account = goodput.account(run)
    assert account.kept == history
    assert (account.seconds["productive"], account.seconds["wasted"]) == (75.0, 10.0)


def test_interruptions_are_classified_with_lost_steps_and_recovery_time(run):
    events = goodput.account(run).events
    assert [(e.kind, e.step, e.lost_steps, e.resumed_from) for e in events] == [("notice", 50, 0, 50),
                                                                             ("kill", 80, 10, 70)]
    assert events[0].recovery_s == 1140.0 - 1090.0  # from the notice to B's first step
    assert events[1].recovery_s == 1225.0 - 1200.0  # from B's last sign of life to C's first step


@pytest.mark.parametrize(("log_every", "at_most"), [(1, 11), (10, 29)])
def test_a_kill_bounds_its_lost_steps_by_the_records_it_may_not_have_written(run, log_every, at_most):
    status = goodput.read_status(run, "b")
    assert status is not None
    run.child("b", goodput.STATUS_FILE).write_text(json.dumps({**status, "log_every": log_every}))
    notice, kill = goodput.account(run).events
    assert (notice.lost_steps, notice.lost_steps_at_most) == (0, 0)  # a committed notice wrote every record first
    assert (kill.lost_steps, kill.lost_steps_at_most) == (10, at_most)  # the interval trained and the one in flight
    assert goodput.account(run).to_dict()["lost_steps_at_most"] == at_most


def test_an_error_ending_an_attempt_is_its_own_kind(run):
    status = goodput.read_status(run, "b")
    assert status is not None
    run.child("b", goodput.STATUS_FILE).write_text(json.dumps({**status, "error": "FloatingPointError: loss is nan"}))
    assert [e.kind for e in goodput.account(run).events] == ["notice", "error"]


def test_live_goodput_counts_earlier_attempts_kept_steps(run, monkeypatch):
    live = goodput.LiveGoodput(goodput.account(run), from_step=70)  # as attempt C starts
    monkeypatch.setattr(goodput.time, "time", lambda: 1300.0)
    assert live(productive_this_attempt=30.0) == pytest.approx(100 / 300)


def test_records_outlive_a_storage_outage_and_the_newest_version_wins(s3_server, tmp_path):
    from spotray.drills.outage import OutageProxy
    from spotray.drills.s3local import create_bucket
    from spotray.storage import StorageOptions

    with OutageProxy(s3_server) as proxy:
        location = resolve(f"{create_bucket(s3_server)}/r.txt", StorageOptions(endpoint_url=proxy.endpoint))
        writer = ledger.RecordWriter()
        proxy.cut()
        writer.put(location, "old")
        writer.put(location, "new")
        assert writer.flush() is False  # gives up at once: never blocks training during the outage
        proxy.restore()
        writer.close(timeout_s=60)
        assert location.read_text() == "new"


def test_a_closed_writer_ends_its_thread_and_a_record_put_after_close_is_written_all_the_same(tmp_path):
    def writer_threads() -> int:
        return sum(thread.name == "spotray-records" for thread in threading.enumerate())

    before, writer = writer_threads(), ledger.RecordWriter()
    writer.put(resolve(str(tmp_path)).child("a.txt"), "a")
    writer.close(timeout_s=10)
    deadline = time.monotonic() + 10
    while writer_threads() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer_threads() == before  # many attempts in one process leave no thread behind
    writer.put(resolve(str(tmp_path)).child("b.txt"), "b")  # a failure recorded after the attempt closed
    writer.close(timeout_s=10)
    assert (tmp_path / "a.txt").read_text() == "a" and (tmp_path / "b.txt").read_text() == "b"


def test_driver_prints_one_line_per_interruption_and_recovery(tmp_path):
    root = resolve(str(tmp_path / "attempts"))
    write_attempt(root, "a", 0, 50, {"entered_at": 1010.0, "first_step_at": 1016.0, "last_seen": 1110.0, "step": 50,
                                     "notice": {"step": 50, "at": 1090.0, "committed": True}})
    stream = io.StringIO()
    monitor = ProgressMonitor(root, tokens_per_step=1024, stream=stream)  # attempt a belongs to an earlier driver
    write_attempt(root, "b", 50, 80, {"entered_at": 1130.0, "first_step_at": 1140.0, "last_seen": 1200.0,
                                      "step": 80, "log_every": 5})
    write_attempt(root, "c", 70, 100, {"entered_at": 1215.0, "last_seen": 1216.0})
    monitor.poll()  # no evidence yet of why b ended, and c has not trained: nothing said
    endings.record(root, "b", endings.KILL, "node ray-b (spot) lost: Ray says UNEXPECTED_TERMINATION")
    monitor.poll()
    write_attempt(root, "c", 70, 100, {"entered_at": 1215.0, "first_step_at": 1225.0, "last_seen": 1300.0,
                                       "step": 100})
    monitor.poll()
    monitor.poll()  # nothing is announced twice
    lines = [line for line in stream.getvalue().splitlines() if "INTERRUPT" in line or "RESUMED" in line]
    assert lines == [
        "spotray: SPOT INTERRUPTION without notice at step 80: spot node lost without notice (node ray-b (spot) "
        "lost: Ray says UNEXPECTED_TERMINATION)",
        "spotray: RESUMED from step 70 on 2 workers, 25.0s after the interruption, 10 steps lost by the records, "
        "at most 19",
    ]


def test_the_drivers_lines_count_an_ended_attempts_steps_from_its_records_as_status_does(tmp_path):
    """A kill between the two writes of a step leaves its record in storage and the status one log interval behind:
    the driver's lines say what `spotray status` says, from the records."""
    root = resolve(str(tmp_path / "attempts"))
    stream = io.StringIO()
    monitor = ProgressMonitor(root, tokens_per_step=1024, stream=stream)
    write_attempt(root, "a", 0, 71, {"entered_at": 1010.0, "first_step_at": 1016.0, "last_seen": 1110.0, "step": 70,
                                     "log_every": 1})
    endings.record(root, "a", endings.KILL, "node ray-a (spot) lost: Ray says UNEXPECTED_TERMINATION")
    write_attempt(root, "b", 70, 100, {"entered_at": 1115.0, "first_step_at": 1120.0, "last_seen": 1200.0,
                                       "step": 100})
    monitor.poll()
    lines = [line for line in stream.getvalue().splitlines() if not line.startswith("spotray: step ")]
    assert lines == [
        "spotray: SPOT INTERRUPTION without notice at step 71: spot node lost without notice (node ray-a (spot) "
        "lost: Ray says UNEXPECTED_TERMINATION)",
        "spotray: RESUMED from step 70 on 2 workers, 10.0s after the interruption, 1 step lost by the records, at "
        "most 2"]
    [event] = goodput.account(root).events
    assert (event.step, event.lost_steps, event.lost_steps_at_most) == (71, 1, 2)


@pytest.mark.parametrize(("grown_to", "why"), [(4, "capacity for the whole group was back"),
                                              (3, "room for more workers was back (growing to 4 once all fit)")])
def test_a_run_that_shrinks_and_grows_back_says_so_and_its_resize_is_no_interruption(tmp_path, grown_to, why):
    root = resolve(str(tmp_path / "attempts"))
    stream = io.StringIO()
    monitor = ProgressMonitor(root, tokens_per_step=1024, stream=stream)
    write_attempt(root, "a", 0, 50, {"entered_at": 1010.0, "first_step_at": 1016.0, "last_seen": 1110.0, "step": 50},
                  world_size=4)
    endings.record(root, "a", endings.KILL, "node ray-a (spot) lost: Ray says UNEXPECTED_TERMINATION")
    write_attempt(root, "b", 48, 90, {"entered_at": 1115.0, "first_step_at": 1120.0, "last_seen": 1200.0, "step": 90,
                                      "grew": {"step": 90, "at": 1200.0}, "from_snapshot": True}, world_size=2)
    monitor.poll()
    write_attempt(root, "c", 90, 100, {"entered_at": 1204.0, "first_step_at": 1210.0, "last_seen": 1230.0,
                                       "step": 100}, world_size=grown_to, configured_workers=4)
    monitor.poll()
    monitor.poll()
    lines = [line for line in stream.getvalue().splitlines() if not line.startswith("spotray: step ")]
    assert lines == [
        "spotray: SPOT INTERRUPTION without notice at step 50: spot node lost without notice (node ray-a (spot) "
        "lost: Ray says UNEXPECTED_TERMINATION)",
        "spotray: SHRUNK to 2 workers from step 48 (a snapshot in memory): going on without the lost node's "
        "workers; 10.0s after the interruption, 2 steps lost by the records, at most 3; growing back when capacity "
        "returns",
        f"spotray: GREW to {grown_to} workers from step 90: {why}; 10.0s from the last step, 0 steps lost"]
    account = goodput.account(root)
    assert [(e.kind, e.spot, e.lost_steps_at_most) for e in account.events] == [("kill", True, 3),
                                                                              ("resize", False, 0)]
    assert len(account.interruptions) == 1


def logged_monitor(tmp_path, monkeypatch) -> tuple[Any, io.StringIO, ProgressMonitor, list[float]]:
    """A driver's monitor writing to a log (not a terminal: every line stays), on a clock the test moves."""
    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    root = resolve(str(tmp_path / "attempts"))
    stream = io.StringIO()
    return root, stream, ProgressMonitor(root, tokens_per_step=1024, stream=stream), now


def test_a_log_gets_each_progress_line_once_whatever_events_come_between(tmp_path, monkeypatch):
    root, stream, monitor, now = logged_monitor(tmp_path, monkeypatch)
    at_70: dict[str, Any] = {"entered_at": 1010.0, "first_step_at": 1016.0, "last_seen": 1100.0, "step": 70}
    notice = {"step": 73, "at": 1090.0, "committed": True}
    for status in (at_70, {**at_70, "notice": notice}, {**at_70, "notice": notice, "moved_at": 1096.0},
                   {**at_70, "step": 75}):
        write_attempt(root, "a", 0, status["step"], status)
        monitor.poll()
        now[0] += 12  # past the 10 s a log waits between progress lines
    lines = stream.getvalue().splitlines()
    assert [line.split(" |")[0] for line in lines] == [
        "spotray: step 70/100", "spotray: PREEMPTION NOTICE at step 73: emergency checkpoint committed",
        "spotray: MOVING ON from step 73: the workers go on without the node, 6.0s after the notice, without "
        "waiting for it to go", "spotray: step 75/100"]


def test_a_progress_line_read_with_a_notice_comes_before_the_notice_its_step_preceded(tmp_path, monkeypatch):
    """The demo printed "PREEMPTION NOTICE at step 364", "MOVING ON from step 364", then "step 360/900"."""
    root, stream, monitor, now = logged_monitor(tmp_path, monkeypatch)
    at_60: dict[str, Any] = {"entered_at": 1010.0, "first_step_at": 1016.0, "last_seen": 1090.0, "step": 60}
    write_attempt(root, "a", 0, 60, at_60)
    monitor.poll()
    now[0] += 12
    write_attempt(root, "a", 0, 70, {**at_60, "step": 70, "last_seen": 1100.0,
                                     "notice": {"step": 73, "at": 1100.0, "committed": True}, "moved_at": 1101.0})
    monitor.poll()
    assert [line.split(" |")[0].split(":")[1] for line in stream.getvalue().splitlines()] == [
        " step 60/100", " step 70/100", " PREEMPTION NOTICE at step 73", " MOVING ON from step 73"]


def test_no_progress_line_of_a_step_before_a_notice_already_said_comes_after_it(tmp_path, monkeypatch):
    """The demo printed "PREEMPTION NOTICE at step 354", "MOVING ON from step 354", then "step 350/900": the poll that
    read the notice was within a log's 10 s of the last progress line, and the next one printed the stale step."""
    root, stream, monitor, now = logged_monitor(tmp_path, monkeypatch)
    at_60: dict[str, Any] = {"entered_at": 1010.0, "first_step_at": 1016.0, "last_seen": 1090.0, "step": 60}
    noticed = {**at_60, "step": 70, "notice": {"step": 73, "at": 1100.0, "committed": True}, "moved_at": 1101.0}
    for status, seconds in ((at_60, 5), (noticed, 12), (noticed, 12), ({**noticed, "step": 80}, 12)):
        write_attempt(root, "a", 0, status["step"], status)
        monitor.poll()
        now[0] += seconds
    assert [line.split(" |")[0].split(":")[1] for line in stream.getvalue().splitlines()] == [
        " step 60/100", " PREEMPTION NOTICE at step 73", " MOVING ON from step 73", " step 80/100"]


def test_a_finish_is_said_only_once_the_rerun_trains_so_a_rerun_that_trains_nothing_says_one_line(tmp_path,
                                                                                                       monkeypatch):
    """A finished script run again said "the run was finished at step 40: not an interruption" before its own
    "finished at step 40 already: nothing to train": the rerun's workers had only started, and then trained nothing."""
    root, stream, monitor, now = logged_monitor(tmp_path, monkeypatch)
    write_attempt(root, "a", 0, 40, {"entered_at": 1010.0, "first_step_at": 1016.0, "last_seen": 1056.0, "step": 40})
    ledger.write_final(root, "a", {"final_step": 40})
    write_attempt(root, "b", 40, 40, {"entered_at": 2000.0, "last_seen": 2005.0})
    monitor.poll()
    assert "finished" not in stream.getvalue()
    write_attempt(root, "b", 40, 45, {"entered_at": 2000.0, "first_step_at": 2010.0, "last_seen": 2015.0, "step": 45})
    now[0] += 12
    monitor.poll()
    assert [line.split(" on ")[0] for line in stream.getvalue().splitlines()[:2]] == [
        "spotray: the run was finished at step 40: not an interruption", "spotray: CONTINUING from step 40"]


def test_the_driver_reads_each_attempts_record_once(tmp_path):
    """It polls storage every few seconds for the whole run: an attempt's record, written once, is not read again."""
    root = resolve(str(tmp_path / "attempts"))
    write_attempt(root, "a", 0, 50, {"entered_at": 1010.0, "first_step_at": 1016.0, "last_seen": 1110.0, "step": 50})
    stream = io.StringIO()
    monitor = ProgressMonitor(root, tokens_per_step=1024, stream=stream)
    root.child("a", "attempt.json").write_text("unreadable")  # reading it again would fail
    write_attempt(root, "b", 40, 60, {"entered_at": 1130.0, "first_step_at": 1140.0, "last_seen": 1200.0,
                                      "step": 60})
    monitor.poll()
    assert "RESUMED from step 40 on 2 workers, 30.0s after the interruption, 10 steps lost" in stream.getvalue()


def test_the_driver_reads_an_ended_attempts_status_once_and_no_file_as_an_attempt(tmp_path, monkeypatch):
    """Each poll is storage requests (S3 bills them, and a loopback one spends the CPU a recovery needs): the files
    beside the attempts are not probed as attempts, and an attempt a newer one followed has its final status."""
    root = resolve(str(tmp_path / "attempts"))
    root.child("run.json").write_text(json.dumps({"started_at": 1000.0}))
    write_attempt(root, "a", 0, 50, {"entered_at": 1010.0, "first_step_at": 1016.0, "last_seen": 1110.0, "step": 50})
    monitor = ProgressMonitor(root, tokens_per_step=1024, stream=io.StringIO())
    write_attempt(root, "b", 40, 60, {"entered_at": 1130.0, "first_step_at": 1140.0, "last_seen": 1200.0,
                                      "step": 60})
    reads = []
    read = type(root).read_text_if_exists

    def recorded_read(self):
        reads.append(self.url)
        return read(self)

    monkeypatch.setattr(type(root), "read_text_if_exists", recorded_read)
    for _ in range(3):
        monitor.poll()
    reads = [url.removeprefix(root.url) for url in reads]
    assert [url for url in reads if url.endswith("attempt.json")] == ["/b/attempt.json"]
    assert [url for url in reads if url.endswith("status.json")] == ["/a/status.json", *["/b/status.json"] * 3]


def test_a_resuming_attempt_exports_the_badput_so_far_counting_the_steps_it_will_retrain_as_wasted(tmp_path):
    """A trains 1-50 and is drained; B resumes at 50 and vanishes at 80; C starts from the step-70 checkpoint."""
    root = resolve(str(tmp_path / "attempts"))
    root.child("run.json").write_text(json.dumps({"started_at": 1000.0}))
    write_attempt(root, "a", 0, 50, {"entered_at": 1010.0, "startup_s": 5.0, "drain_wait_s": 20.0,
                                     "last_seen": 1110.0, "notice": {"step": 50, "at": 1090.0, "committed": True}})
    write_attempt(root, "b", 50, 80, {"entered_at": 1130.0, "startup_s": 4.0, "restore_s": 1.0,
                                      "first_step_at": 1140.0, "last_seen": 1200.0})
    info = ledger.AttemptInfo("c", 70, world_size=2, per_rank_batch=4, started_at=1215.0)
    ledger.write_attempt(root, info)
    # C's own clock already flushed (it races the history read): C's time must come from its clock, once
    root.child("c", goodput.STATUS_FILE).write_text(json.dumps({"entered_at": 1215.0, "startup_s": 3.0,
                                                                "restore_s": 2.0, "last_seen": 1216.0}))
    writer = ledger.RecordWriter()
    telemetry = RankZeroTelemetry(attempts_root=root, attempt=info, entered_at=1215.0, max_steps=100,
                                  tokens_per_step=512, flops_per_token=1e6, peak=None, run_name="r", writer=writer)
    telemetry.started(startup_s=3.0, restore_s=2.0)
    telemetry.step_done(1.5)
    seconds = telemetry._time_by_category()
    writer.close(timeout_s=10)
    assert seconds["productive"] == 70.0 + 1.5  # A's 1-50 and B's 51-70 are kept; C's first step
    assert seconds["wasted"] == 10.0  # B's 71-80: C trains them again
    assert seconds["startup"] == 10.0 + 5 + 4 + 3 and seconds["restore"] == 1.0 + 2
    assert seconds["waiting"] == 20.0 + (1130 - 1110) + (1215 - 1200)
    assert telemetry.past().interrupted_at == 1200.0  # B was last seen then: recovery is measured from it


def test_a_notice_the_polls_missed_while_its_attempt_was_the_newest_is_still_said_before_the_next_attempt(
        tmp_path):
    root = resolve(str(tmp_path / "attempts"))
    stream = io.StringIO()
    monitor = ProgressMonitor(root, tokens_per_step=1024, stream=stream)
    notice = {"step": 73, "at": 1090.0, "committed": True, "kept_in": "snapshot"}
    write_attempt(root, "a", 0, 73, {"entered_at": 1010.0, "first_step_at": 1016.0, "last_seen": 1091.0, "step": 73,
                                     "notice": notice, "moved_at": 1090.3}, world_size=3)
    write_attempt(root, "b", 73, 80, {"entered_at": 1090.5, "first_step_at": 1090.9, "last_seen": 1100.0, "step": 80,
                                      "from_snapshot": True}, world_size=2)  # the survivors, within one poll
    monitor.poll()
    lines = [line for line in stream.getvalue().splitlines() if not line.startswith("spotray: step ")]
    assert lines[:2] == [
        "spotray: PREEMPTION NOTICE at step 73: emergency snapshot committed, in the memory of the nodes that stay",
        "spotray: MOVING ON from step 73: the workers go on without the node, 0.3s after the notice, without waiting "
        "for it to go"], lines
    assert lines[2].startswith("spotray: SHRUNK to 2 workers from step 73 (a snapshot in memory)"), lines
