"""The exactly-once audit (``ledger.verify_exactly_once``), the check behind every run's "exactly once: yes": it passes
a run that trained each sample of an epoch once, across a resume that trained steps again, and fails on each defect
it guards: a sample trained twice in an epoch, a step nobody recorded."""

import time

import pytest

from spotray.accounts import ledger
from spotray.errors import StorageError
from spotray.storage import Location, resolve

NUM_SAMPLES = 8  # an epoch: 4 steps of 2 ranks x 1 sample


def audit_root(tmp_path, *attempts: tuple[int, list[list[int]]]) -> Location:
    """Each attempt as (the step it resumed from, the sample ids each rank recorded, one per step)."""
    root = resolve(str(tmp_path / "audit"))
    for number, (from_step, ranks) in enumerate(attempts):
        info = ledger.AttemptInfo(f"attempt-{number}", from_step, world_size=len(ranks), per_rank_batch=1)
        ledger.write_attempt(root, info)
        for rank, ids in enumerate(ranks):
            root.child(info.attempt_id, f"rank-{rank:05d}.txt").write_text("".join(f"{i}\n" for i in ids))
    return root


def test_every_sample_once_per_epoch_across_a_resume_passes(tmp_path):
    # the first attempt trained steps 1-3 and was lost after its checkpoint at 2; the second resumed from step 2
    root = audit_root(tmp_path, (0, [[0, 2, 4], [1, 3, 5]]), (2, [[4, 6, 8], [5, 7, 9]]))
    result = ledger.verify_exactly_once(root, NUM_SAMPLES, final_step=5)
    assert result == ledger.AuditResult(True, 5, 10, 0, [])


@pytest.mark.parametrize(("second_attempt", "duplicates", "missing"), [
    ([[4, 2, 8], [5, 7, 9]], 1, []),  # sample 2 trained again at step 4, in the epoch that trained it at step 2
    ([[4], [5]], 0, [4, 5]),  # the second attempt recorded step 3 only
])
def test_a_sample_trained_twice_in_an_epoch_or_a_step_not_recorded_fails(tmp_path, second_attempt, duplicates,
                                                                         missing):
    root = audit_root(tmp_path, (0, [[0, 2, 4], [1, 3, 5]]), (2, second_attempt))
    result = ledger.verify_exactly_once(root, NUM_SAMPLES, final_step=5)
    assert not result.exactly_once and (result.duplicates, result.missing_steps) == (duplicates, missing)


def test_records_written_through_a_mark_do_not_wait_for_those_put_after_it(tmp_path, monkeypatch):
    """A snapshot waits for the records of its steps; records keep coming meanwhile, and one slow write of a later
    record must not hold it up (``flush`` would)."""
    import threading

    release = threading.Event()
    write_text = Location.write_text

    def slow_for_later(self, text):
        if self.name == "later.json":
            release.wait(30)
        write_text(self, text)

    monkeypatch.setattr(Location, "write_text", slow_for_later)
    writer = ledger.RecordWriter()
    mine = resolve(str(tmp_path / "mine.json"))
    writer.put(mine, "1")
    mark = writer.mark()
    writer.put(resolve(str(tmp_path / "later.json")), "x")  # its write hangs
    assert writer.written_through(mark, timeout_s=10) and mine.read_text() == "1"
    assert not writer.flush(timeout_s=0.5)
    writer.put(mine, "2")  # queued behind the hanging write
    assert not writer.written_through(writer.mark(), timeout_s=0.5)
    release.set()
    assert writer.written_through(writer.mark(), timeout_s=10) and mine.read_text() == "2"


def writes_failing_by(monkeypatch, before_write) -> list[str]:
    """Every write calls ``before_write(writes tried so far)`` first, which may raise; a failed write is tried again
    a minute later unless a save hurries it. Returns the names written, in order."""
    monkeypatch.setattr(ledger, "RETRY_FIRST_S", 60.0)
    tries: list[str] = []
    write_text = Location.write_text

    def write(self, text):
        tries.append(self.name)
        before_write(len(tries))
        write_text(self, text)

    monkeypatch.setattr(Location, "write_text", write)
    return tries


def test_a_save_waiting_for_records_has_a_write_waiting_out_its_backoff_tried_at_once_and_fails_if_that_fails(
        tmp_path, monkeypatch):
    """Storage came back while the writer rests after a failed write: a checkpoint must not fail for that, nor commit
    without the records (a kill after it would take them, and the run resumed from it would lack its steps)."""
    down = [True]

    def while_down(tries: int) -> None:
        if down[0]:
            raise StorageError("storage is failing")

    tries = writes_failing_by(monkeypatch, while_down)
    writer = ledger.RecordWriter()
    record = resolve(str(tmp_path / "losses.jsonl"))
    writer.put(record, "1")
    while not writer.failing:
        time.sleep(0.01)
    time.sleep(0.2)  # into its backoff
    with pytest.raises(OSError, match="records of its steps could not be written"):
        writer.check_written()()  # still down: one more try, at once, and it fails
    assert len(tries) == 2
    down[0] = False
    writer.check_written()()  # back: written now, not after the 60 s backoff
    assert record.read_text() == "1" and not writer.failing


def test_a_write_that_fails_while_a_save_waits_is_tried_again_at_once_before_the_save_gives_up(tmp_path, monkeypatch):
    """The records' first write fails only once the save waits for it: the save must get the same one retry at once
    as a save that began after the failure, not fail (or wait out the backoff) for the order of the two."""
    import threading

    writing, fail_now = threading.Event(), threading.Event()

    def first_fails_once_the_save_waits(tries: int) -> None:
        if tries == 1:
            writing.set()
            fail_now.wait(10)
            raise StorageError("storage is failing")

    tries = writes_failing_by(monkeypatch, first_fails_once_the_save_waits)
    writer = ledger.RecordWriter()
    record = resolve(str(tmp_path / "losses.jsonl"))
    writer.put(record, "1")
    writing.wait(10)
    threading.Timer(0.2, fail_now.set).start()  # fails while the save below waits
    started = time.monotonic()
    assert writer.written_through(writer.mark(), timeout_s=30)
    assert record.read_text() == "1" and len(tries) == 2 and time.monotonic() - started < 10


def test_a_save_that_begins_while_a_failed_write_is_being_reported_still_gets_its_one_retry(tmp_path, monkeypatch):
    """The CI of a224d21: a save began while the writer logged its first failure (a log sink is slow at times), and
    gave up at once, as if the retry it asked for had failed. The failure and its count of tries are one fact."""
    import logging
    import threading

    logger = logging.getLogger(ledger.__name__)
    reporting = threading.Event()

    class SlowSink(logging.Handler):
        def emit(self, record):
            if "cannot write" in record.getMessage():
                reporting.set()
                time.sleep(0.05)

    fail_next = [False]

    def once_per_attempt(tries: int) -> None:
        if fail_next[0]:
            fail_next[0] = False
            raise StorageError("storage is failing")

    writes_failing_by(monkeypatch, once_per_attempt)
    sink = SlowSink()
    logger.addHandler(sink)
    try:
        for attempt in range(20):  # whether the save or the writer takes the lock first is up to the scheduler
            fail_next[0] = True
            reporting.clear()
            writer = ledger.RecordWriter()
            record = resolve(str(tmp_path / f"losses-{attempt}.jsonl"))
            writer.put(record, "1")
            assert reporting.wait(10)
            assert writer.written_through(writer.mark(), timeout_s=30), f"gave up without its retry (try {attempt})"
            assert record.read_text() == "1"
    finally:
        logger.removeHandler(sink)


def test_a_write_that_fails_with_an_error_other_than_storages_is_reported_and_retried_not_left_to_time_out(
        tmp_path, monkeypatch, caplog):
    """A bug's error in a write (not a StorageError) must not end the writer's thread: the save waiting for the
    records gets its retry at once, as in an outage, and the warning names the error's type."""
    def first_has_a_bug(tries: int) -> None:
        if tries == 1:
            raise KeyError("no such part")

    tries = writes_failing_by(monkeypatch, first_has_a_bug)
    writer = ledger.RecordWriter()
    record = resolve(str(tmp_path / "losses.jsonl"))
    writer.put(record, "1")
    started = time.monotonic()
    writer.check_written()()
    assert record.read_text() == "1" and len(tries) == 2 and time.monotonic() - started < ledger.RECORDS_BEFORE_SAVE_S
    assert "KeyError: 'no such part'" in caplog.text
