"""Where a run's wall time went, and what interrupted it, from the ledger in storage (survives restarts).

Rank 0 of every attempt keeps an ``AttemptClock`` and rewrites the attempt's ``status.json`` at each log
interval. Goodput is the time spent on steps that the final model kept, over the wall time since the run
started; steps that a later attempt trained again are wasted.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from spotray.accounts import ledger
from spotray.storage import Location

STATUS_FILE = "status.json"
# eval: validation passes, in the wall time but neither productive nor wasted
CATEGORIES = ("productive", "startup", "restore", "checkpoint_save", "eval", "wasted", "waiting", "other")


class AttemptClock:
    """Rank 0's account of one attempt: seconds by category, live progress and how the attempt ended."""

    def __init__(self, root: Location, attempt_id: str, entered_at: float, max_steps: int | None,
                 writer: ledger.RecordWriter, log_every: int = 1):
        self.location, self.writer = ledger.attempt_file(root, attempt_id, STATUS_FILE), writer
        self.status: dict = {
            "entered_at": entered_at, "startup_s": 0.0, "restore_s": 0.0, "checkpoint_save_s": 0.0, "eval_s": 0.0,
            "drain_wait_s": 0.0, "first_step_at": None, "last_seen": entered_at, "notice": None, "moved_at": None,
            "error": None, "step": None, "max_steps": max_steps, "log_every": log_every, "loss": None,
            "tokens_per_s": None, "goodput": None, "val_loss": None, "val_step": None,
            "failed_saves": 0,
        }

    def add(self, category: str, seconds: float) -> None:
        self.status[f"{category}_s"] += seconds

    def update(self, **fields) -> None:
        self.status.update(fields)

    def flush(self) -> None:
        self.status["last_seen"] = time.time()
        self.writer.put(self.location, json.dumps(self.status, sort_keys=True))


def read_status(root: Location, attempt_id: str) -> dict | None:
    text = ledger.attempt_file(root, attempt_id, STATUS_FILE).read_text_if_exists()
    return json.loads(text) if text is not None else None


class LiveGoodput:
    """Goodput while training: productive seconds of earlier attempts' kept steps, plus this attempt's."""

    def __init__(self, history: Account, from_step: int):
        self.run_started = history.started_at
        self.prior_productive = sum(r.seconds for step, r in history.kept.items() if step <= from_step)

    def __call__(self, productive_this_attempt: float) -> float:
        elapsed = time.time() - self.run_started
        return min(1.0, (self.prior_productive + productive_this_attempt) / elapsed) if elapsed > 0 else 0.0


@dataclass(frozen=True)
class Event:
    """One interruption: ``kind`` is notice (drain announced), kill (gone without notice) or error."""

    kind: str
    step: int
    lost_steps: int  # trained by the interrupted attempt past the step resumed from, as its records show
    lost_steps_at_most: int  # equal to lost_steps where that is exact (a committed notice flushes every record)
    recovery_s: float | None  # interruption -> first step of the next attempt
    resumed_from: int
    interrupted_at: float  # UNIX time

    def to_dict(self) -> dict:
        return {"kind": self.kind, "step": self.step, "lost_steps": self.lost_steps,
                "lost_steps_at_most": self.lost_steps_at_most,
                "recovery_s": None if self.recovery_s is None else round(self.recovery_s, 2),
                "resumed_from": self.resumed_from}


@dataclass(frozen=True)
class Account:
    seconds: dict[str, float]
    total_s: float
    events: list[Event]
    started_at: float  # UNIX time the run started
    kept: dict[int, ledger.StepRecord]  # the final model's history so far (``ledger.lineage``)

    @property
    def goodput(self) -> float:
        return self.seconds["productive"] / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {"goodput": round(self.goodput, 4), "total_s": round(self.total_s, 2),
                "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
                "lost_steps": sum(e.lost_steps for e in self.events),
                "lost_steps_at_most": sum(e.lost_steps_at_most for e in self.events),
                "events": [e.to_dict() for e in self.events]}


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt as its ledger has it; ``steps`` may be left empty, its status then says how far it got."""

    info: ledger.AttemptInfo
    status: dict | None
    steps: dict[int, ledger.StepRecord]

    @property
    def last_step(self) -> int:
        return max(self.steps, default=self.status_of("step", None) or self.info.from_step)

    @property
    def entered_at(self) -> float:
        return self.status["entered_at"] if self.status else self.info.started_at

    @property
    def last_seen(self) -> float:
        return self.status["last_seen"] if self.status else self.info.started_at

    def status_of(self, key: str, default=0.0):
        return self.status.get(key, default) if self.status else default


def attempt_records(root: Location, starting: str | None = None) -> list[AttemptRecord]:
    """Every attempt's records under ``root``, oldest first.

    ``starting``: the attempt now starting, whose own clock keeps its time: its status and steps are left out."""
    return [AttemptRecord(a, None if a.attempt_id == starting else read_status(root, a.attempt_id),
                          {} if a.attempt_id == starting else ledger.read_steps(root, a.attempt_id))
            for a in ledger.read_attempts(root)]


def account(root: Location, starting: str | None = None) -> Account:
    """The run's time by category and its interruptions, from every attempt's records under ``root``.

    ``starting``: the attempt now starting, whose own clock keeps its time: only its start counts here."""
    return account_of(attempt_records(root, starting), ledger.run_started_at(root))


def account_of(attempts: list[AttemptRecord], run_started_at: float | None) -> Account:
    """``account`` of records read already (``attempt_records``), for a reader that needs both."""
    if not attempts:
        return Account(dict.fromkeys(CATEGORIES, 0.0), 0.0, [], run_started_at or time.time(), {})
    started = run_started_at or attempts[0].info.started_at
    kept: dict[int, ledger.StepRecord] = {}
    for a in attempts:  # as ledger.lineage, without reading every record again
        kept = ledger.continue_lineage(kept, a.info.from_step, a.steps)
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    seconds["productive"] = sum(r.seconds for r in kept.values())
    seconds["wasted"] = sum(r.seconds for a in attempts for step, r in a.steps.items()
                            if step not in kept or kept[step].attempt_id != a.info.attempt_id)
    seconds["startup"] = attempts[0].entered_at - started
    for a in attempts:
        seconds["startup"] += a.status_of("startup_s")
        seconds["restore"] += a.status_of("restore_s")
        seconds["checkpoint_save"] += a.status_of("checkpoint_save_s")
        seconds["eval"] += a.status_of("eval_s")
        seconds["waiting"] += a.status_of("drain_wait_s")
    for prev, cur in zip(attempts, attempts[1:], strict=False):
        seconds["waiting"] += max(0.0, cur.entered_at - prev.last_seen)
    total = max(a.last_seen for a in attempts) - started
    seconds["other"] = max(0.0, total - sum(seconds.values()))
    events = [interruption(prev, cur) for prev, cur in zip(attempts, attempts[1:], strict=False)]
    return Account(seconds, total, events, started, kept)


def interruption(prev: AttemptRecord, cur: AttemptRecord) -> Event:
    """What ended ``prev`` and how ``cur`` recovered from it (``recovery_s`` None until ``cur`` trained a step)."""
    notice, error = prev.status_of("notice", None), prev.status_of("error", None)
    kind = "notice" if notice else "error" if error else "kill"
    interrupted_at = notice["at"] if notice else prev.last_seen
    step = notice["step"] if notice else prev.last_step
    resumed_at = cur.status_of("first_step_at", None)
    recovery = resumed_at - interrupted_at if resumed_at else None
    lost = max(0, prev.last_step - cur.info.from_step)
    # Step records are written once per log interval, in the background: a kill can take the interval being
    # trained and the one being written with it. A committed notice wrote them all before its checkpoint.
    unrecorded = 0 if notice and notice["committed"] else 2 * int(prev.status_of("log_every", 1)) - 1
    return Event(kind, step, lost, lost + unrecorded, recovery, cur.info.from_step, interrupted_at)
