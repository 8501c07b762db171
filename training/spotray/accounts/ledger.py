"""Per-attempt records in storage (loss log, audit of trained sample ids) and the run's lineage.

A run is a sequence of attempts (one per worker-group start). An attempt resumes from some committed step
and may train past the checkpoint the next attempt resumes from; those steps are wasted. The lineage keeps,
for every step up to where each attempt resumed, the record of the latest attempt that trained it: exactly the
history of the final model.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from spotray.errors import StorageError
from spotray.storage import Location

log = logging.getLogger(__name__)

_ATTEMPT_FILE = "attempt.json"
_LOSSES_FILE = "losses.jsonl"
_EVALS_FILE = "evals.jsonl"
_INTERVALS_FILE = "intervals.jsonl"
_FINAL_FILE = "final.json"
_RUN_FILE = "run.json"
RECORDS_BEFORE_SAVE_S = 10.0  # the most a save waits for the records of its steps before it fails
RETRY_FIRST_S, RETRY_MOST_S = 0.5, 30.0  # a record that failed to write is tried again after these, doubling
T = TypeVar("T")


def attempts_root(run_root: Location) -> Location:
    """Where a run's ledger lives: ``<checkpoint.path>/<run.name>/attempts``."""
    return run_root.child("attempts")


def mark_run_started(root: Location) -> float:
    """The run's start time: recorded by its first driver, kept by every rerun. Returns it."""
    marker = root.child(_RUN_FILE)
    if marker.exists():
        return float(json.loads(marker.read_text())["started_at"])
    started_at = time.time()
    marker.write_text(json.dumps({"started_at": started_at}))
    return started_at


def run_started_at(root: Location) -> float | None:
    marker = root.child(_RUN_FILE)
    return float(json.loads(marker.read_text())["started_at"]) if marker.exists() else None


def attempt_file(root: Location, attempt_id: str, name: str) -> Location:
    return root.child(attempt_id, name)


class RecordsUnwritten(OSError):
    """A save refused because the ledger's records of its steps are not in storage (it is unreachable)."""


class RecordWriter:
    """Writes small records (each rewritten whole) from a background thread, so that training never waits on
    storage for a log line. During an outage it retries with backoff and warns once; the newest version of each
    record wins, so it catches up by itself."""

    def __init__(self):
        self._pending: dict[str, tuple[Location, str, int]] = {}
        self._put: dict[str, int] = {}  # each record's newest version, by a sequence number of the puts
        self._written: dict[str, int] = {}  # each record's newest version written
        self._sequence = 0
        self._tries = 0  # writes tried, failed or not
        self._cond = threading.Condition()
        self._busy = self._closed = self._running = self._hurry = False
        self.failing = False
        with self._cond:
            self._start()

    def put(self, location: Location, text: str) -> None:
        with self._cond:
            self._sequence += 1
            self._pending[location.url] = (location, text, self._sequence)
            self._put[location.url] = self._sequence
            self._closed = False  # a record after close (a failure recorded late) is written all the same
            if not self._running:
                self._start()
            self._cond.notify_all()

    def _start(self) -> None:
        self._running = True
        threading.Thread(target=self._run, daemon=True, name="spotray-records").start()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything put so far is written; gives up at once while storage is failing."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while (self._pending or self._busy) and not self.failing:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return not (self._pending or self._busy)

    def mark(self) -> dict[str, int]:
        """What has been put so far, for ``written_through``."""
        with self._cond:
            return dict(self._put)

    def written_through(self, mark: dict[str, int], timeout_s: float) -> bool:
        """Wait until every record as of ``mark`` (or a newer version of it) is written, however many are put
        meanwhile. While storage is failing, whether before this call or from a write during it, the write waiting
        out its backoff is tried again at once, and one more failure after that gives up; so does ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            hurried_at: int | None = None  # the writes tried when this call cut a backoff short
            while any(self._written.get(url, 0) < seq for url, seq in mark.items()):
                if self.failing:
                    if hurried_at is None:
                        hurried_at, self._hurry = self._tries, True
                        self._cond.notify_all()
                    elif self._tries > hurried_at:
                        return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def check_written(self) -> Callable[[], None]:
        """As a save starts: what it runs before it writes (``Checkpointer.records_first``), so that no checkpoint
        or snapshot holds a step whose records could be lost with its node. Raises RecordsUnwritten where the records
        put before the save began cannot be written."""
        mark = self.mark()

        def written() -> None:
            if not self.written_through(mark, timeout_s=RECORDS_BEFORE_SAVE_S):
                raise RecordsUnwritten("the ledger's records of its steps could not be written to storage")
        return written

    def close(self, timeout_s: float) -> None:
        """Everything written within ``timeout_s``, through an outage, and the thread ended; or a StorageError (the
        thread goes on trying)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    names = ", ".join(sorted(self._pending)) or "a record"
                    raise StorageError(f"could not write {names} within {timeout_s:g}s: storage is unreachable")
                self._cond.wait(remaining)
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        backoff = RETRY_FIRST_S
        while True:
            with self._cond:
                while not self._pending:
                    if self._closed:
                        self._running = False
                        return
                    self._cond.wait()
                url = next(iter(self._pending))
                location, text, sequence = self._pending.pop(url)
                self._busy = True
            error: Exception | None = None
            try:
                location.write_text(text)
            except Exception as exc:  # not only StorageError: a thread that died would leave every save to time out
                error = exc
            was_failing = self._settle(url, (location, text, sequence), written=error is None)
            if error is not None:
                if not was_failing:
                    log.warning("cannot write %s (%s); training goes on and the records catch up later",
                                location.url, _first_line(error))
                self._rest(backoff)
                backoff = min(2 * backoff, RETRY_MOST_S)
                continue
            if was_failing:
                log.warning("storage is reachable again: records caught up")
            backoff = RETRY_FIRST_S

    def _settle(self, url: str, record: tuple[Location, str, int], written: bool) -> bool:
        """A write's outcome and its count of tries, recorded together: a save looking in between would take a failure
        not yet counted for its own retry failing (``written_through``). Returns whether storage was failing before."""
        with self._cond:
            was_failing, self.failing = self.failing, not written
            if written:
                self._written[url] = max(self._written.get(url, 0), record[2])
            else:
                self._pending.setdefault(url, record)  # a newer version put meanwhile wins
            self._busy = False
            self._tries += 1
            self._cond.notify_all()
            return was_failing

    def _rest(self, seconds: float) -> None:
        """The backoff after a failed write, cut short where a save waits for the records (``written_through``)."""
        with self._cond:
            self._cond.wait_for(lambda: self._hurry, seconds)
            self._hurry = False


def _first_line(error: Exception) -> str:
    """A StorageError names its URL and cause; any other error (a bug's) is named by its type."""
    text = (str(error).splitlines() or [""])[0][:200]
    return text if isinstance(error, StorageError) else f"{type(error).__name__}: {text}"


def new_attempt_id() -> str:
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:6]}"


@dataclass
class AttemptInfo:
    attempt_id: str
    from_step: int
    world_size: int
    per_rank_batch: int
    started_at: float = field(default_factory=time.time)
    nodes: list[str] = field(default_factory=list)  # the node each rank ran on (``node_records.this_node``)
    gpus_per_worker: float = 0.0
    configured_workers: int = 0  # scaling.num_workers, which a run below it grows back to (0: not recorded)


def write_attempt(root: Location, info: AttemptInfo) -> None:
    root.child(info.attempt_id, _ATTEMPT_FILE).write_text(json.dumps(info.__dict__, sort_keys=True))


def read_attempts(root: Location, known: dict[str, AttemptInfo] | None = None) -> list[AttemptInfo]:
    """The run's attempts, oldest first. ``known`` caches the ones read before (an attempt's record is written
    once), so that a poller reads only new attempts' records."""
    known = {} if known is None else known
    for name in root.list_dir_names():  # run.json, nodes.json, cost.json: files beside the attempts
        if name in known:
            continue
        record = root.child(name, _ATTEMPT_FILE).read_text_if_exists()
        if record is not None:
            known[name] = AttemptInfo(**json.loads(record))
    return sorted(known.values(), key=lambda a: a.attempt_id)


def write_final(root: Location, attempt_id: str, final: dict) -> None:
    root.child(attempt_id, _FINAL_FILE).write_text(json.dumps(final, sort_keys=True))


def attempt_finished(root: Location, attempt_id: str) -> bool:
    """The attempt trained to the end and recorded its final metrics."""
    return root.child(attempt_id, _FINAL_FILE).exists()


def read_final(root: Location) -> dict | None:
    """Final metrics of the newest attempt that finished the run."""
    for attempt in reversed(read_attempts(root)):
        final = root.child(attempt.attempt_id, _FINAL_FILE)
        if final.exists():
            return json.loads(final.read_text())
    return None


class LossLog:
    """Rank 0's per-step losses, step times, learning rates and gradient norms of one attempt, rewritten in full at
    each flush (small, atomic)."""

    def __init__(self, root: Location, attempt_id: str, writer: RecordWriter):
        self.location, self.writer = attempt_file(root, attempt_id, _LOSSES_FILE), writer
        self.losses: dict[int, float | None] = {}  # None: a script reported the step without a loss
        self.lines: dict[int, str] = {}

    def record(self, step: int, loss: float | None, seconds: float, lr: float | None = None,
               grad_norm: float | None = None, tokens: int | None = None) -> None:
        self.losses[step] = loss
        self.lines[step] = json.dumps({"step": step, "loss": loss, "s": round(seconds, 6), "lr": lr, "gn": grad_norm,
                                       "tok": tokens})

    def flush(self) -> None:
        self.writer.put(self.location, "".join(f"{self.lines[s]}\n" for s in sorted(self.lines)))


class JsonlLog:
    """One attempt's records keyed by step (evaluations, log intervals), rewritten in full at each flush."""

    def __init__(self, root: Location, attempt_id: str, name: str, writer: RecordWriter):
        self.location, self.writer = attempt_file(root, attempt_id, name), writer
        self.records: dict[int, dict] = {}

    def record(self, step: int, **fields) -> None:
        self.records[step] = {"step": step, **fields}
        self.writer.put(self.location, "".join(json.dumps(self.records[s], sort_keys=True) + "\n"
                                              for s in sorted(self.records)))


def eval_log(root: Location, attempt_id: str, writer: RecordWriter) -> JsonlLog:
    """Rank 0's evaluations: ``{"step", "metrics": {name: value}, "s": seconds}`` per evaluated step."""
    return JsonlLog(root, attempt_id, _EVALS_FILE, writer)


def interval_log(root: Location, attempt_id: str, writer: RecordWriter) -> JsonlLog:
    """Rank 0's log intervals: throughput, MFU, goodput and every rank's memory at the interval's last step."""
    return JsonlLog(root, attempt_id, _INTERVALS_FILE, writer)


class AuditLog:
    """One rank's trained sample ids of one attempt, one id per line, in training order."""

    def __init__(self, root: Location, attempt_id: str, rank: int, writer: RecordWriter):
        self.location, self.writer = attempt_file(root, attempt_id, f"rank-{rank:05d}.txt"), writer
        self.ids: list[int] = []

    def record(self, ids: list[int]) -> None:
        self.ids.extend(ids)

    def flush(self) -> None:
        self.writer.put(self.location, "".join(f"{i}\n" for i in self.ids))


@dataclass(frozen=True)
class StepRecord:
    attempt_id: str
    loss: float | None  # None: a script reported the step's time, not its loss
    seconds: float
    lr: float | None = None
    grad_norm: float | None = None
    tokens: int | None = None  # trained at this step, all ranks (a task's loss units where they are not tokens)


def read_steps(root: Location, attempt_id: str) -> dict[int, StepRecord]:
    """step -> what one attempt recorded for it (empty if it recorded nothing)."""
    return {step: StepRecord(attempt_id, r["loss"], float(r.get("s", 0.0)), r.get("lr"), r.get("gn"), r.get("tok"))
            for step, r in _read_jsonl(root, attempt_id, _LOSSES_FILE).items()}


def read_evals(root: Location, attempt_id: str) -> dict[int, dict]:
    """step -> one attempt's evaluation there: ``{"step", "metrics", "s", "attempt_id"}``."""
    return _read_jsonl(root, attempt_id, _EVALS_FILE)


def read_intervals(root: Location, attempt_id: str) -> dict[int, dict]:
    """step -> one attempt's log interval ending there (``telemetry.RankZeroTelemetry.logged``)."""
    return _read_jsonl(root, attempt_id, _INTERVALS_FILE)


def _read_jsonl(root: Location, attempt_id: str, name: str) -> dict[int, dict]:
    location = attempt_file(root, attempt_id, name)
    if not location.exists():
        return {}
    records = (json.loads(line) for line in location.read_text().splitlines() if line)
    return {int(r["step"]): {**r, "attempt_id": attempt_id} for r in records}


def lineage(root: Location) -> dict[int, StepRecord]:
    """step -> the record of the latest attempt that trained it: the history of the final model."""
    return lineage_of(root, read_steps)


def lineage_evals(root: Location) -> dict[int, dict]:
    """step -> the evaluation of the final model's history at that step."""
    return lineage_of(root, read_evals)


def lineage_intervals(root: Location) -> dict[int, dict]:
    """step -> the log interval of the final model's history ending at that step."""
    return lineage_of(root, read_intervals)


def lineage_of(root: Location, read: Callable[[Location, str], dict[int, T]]) -> dict[int, T]:
    """The lineage of one kind of per-step record (``read(root, attempt_id)``)."""
    steps: dict[int, T] = {}
    for attempt in read_attempts(root):
        steps = continue_lineage(steps, attempt.from_step, read(root, attempt.attempt_id))
    return steps


def continue_lineage(steps: dict[int, T], from_step: int, trained: dict[int, T]) -> dict[int, T]:
    """The lineage once an attempt that resumed from ``from_step`` trained ``trained``: what earlier attempts
    trained past ``from_step`` is no longer the final model's history, whether or not it is trained again."""
    kept = {step: record for step, record in steps.items() if step <= from_step}
    return dict(sorted({**kept, **trained}.items()))


def lineage_losses(root: Location) -> dict[int, float]:
    """step -> loss of the final model's history (the steps that recorded one)."""
    return {step: record.loss for step, record in lineage(root).items() if record.loss is not None}


def lineage_sample_ids(audit_root: Location) -> dict[int, list[int]]:
    """step -> the sample ids trained at that step (all ranks, rank order), from the audit files."""
    per_step: dict[int, list[int]] = {}
    for attempt in read_attempts(audit_root):
        files = (audit_root.child(attempt.attempt_id, f"rank-{r:05d}.txt") for r in range(attempt.world_size))
        ranks = [_read_ids(f) for f in files]
        steps = min(len(ids) for ids in ranks) // attempt.per_rank_batch
        windows = (slice(k * attempt.per_rank_batch, (k + 1) * attempt.per_rank_batch) for k in range(steps))
        trained = {attempt.from_step + k + 1: [i for ids in ranks for i in ids[window]]
                   for k, window in enumerate(windows)}
        per_step = continue_lineage(per_step, attempt.from_step, trained)
    return per_step


def _read_ids(location: Location) -> list[int]:
    return [int(x) for x in location.read_text().split()] if location.exists() else []


@dataclass(frozen=True)
class AuditResult:
    exactly_once: bool
    steps: int
    samples: int
    duplicates: int
    missing_steps: list[int]


def verify_exactly_once(audit_root: Location, num_samples: int, final_step: int) -> AuditResult:
    """Within each epoch every sample was trained at most once, and every step 1..final_step is accounted for."""
    per_step = lineage_sample_ids(audit_root)
    missing = [s for s in range(1, final_step + 1) if s not in per_step]
    ordered = [i for s in range(1, final_step + 1) for i in per_step.get(s, [])]
    duplicates = 0
    for start in range(0, len(ordered), num_samples):
        epoch = ordered[start : start + num_samples]
        duplicates += len(epoch) - len(set(epoch))
    return AuditResult(not missing and duplicates == 0, final_step, len(ordered), duplicates, missing)
