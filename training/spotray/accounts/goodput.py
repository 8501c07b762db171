"""Where a run's wall time went, and what interrupted it, from the ledger in storage (survives restarts).

Rank 0 of every attempt keeps an ``AttemptClock`` and rewrites the attempt's ``status.json`` at each log
interval. Goodput is the time spent on steps that the final model kept, over the wall time since the run
started; steps that a later attempt trained again are wasted.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from spotray.accounts import endings, ledger
from spotray.storage import Location

STATUS_FILE = "status.json"
# eval: validation passes, in the wall time but neither productive nor wasted; compile: torch.compile's compiling;
# snapshot_*: in-memory snapshots
CATEGORIES = ("productive", "startup", "compile", "restore", "snapshot_restore", "checkpoint_save", "snapshot_save",
              "eval", "wasted", "waiting", "other")
USED_ONLY_CATEGORIES = ("compile", "snapshot_restore", "snapshot_save")  # shown where the run compiled, snapshotted
CLOCKED = ("startup", "compile", "restore", "snapshot_restore", "checkpoint_save", "snapshot_save",
           "eval")  # by each attempt


class AttemptClock:
    """Rank 0's account of one attempt: seconds by category, live progress and how the attempt ended."""

    def __init__(self, root: Location, attempt_id: str, entered_at: float, max_steps: int | None,
                 writer: ledger.RecordWriter, log_every: int = 1):
        self.location, self.writer = ledger.attempt_file(root, attempt_id, STATUS_FILE), writer
        self.status: dict = {
            "entered_at": entered_at, **{f"{category}_s": 0.0 for category in CLOCKED}, "drain_wait_s": 0.0,
            "first_step_at": None, "last_seen": entered_at, "notice": None, "moved_at": None,
            "error": None, "step": None, "max_steps": max_steps, "log_every": log_every, "loss": None,
            "tokens_per_s": None, "goodput": None, "val_loss": None, "val_step": None,
            "failed_saves": 0, "snapshots": 0,
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
        self.run_started, self.paused_s = history.started_at, history.paused_s
        self.prior_productive = sum(r.seconds for step, r in history.kept.items() if step <= from_step)

    def __call__(self, productive_this_attempt: float) -> float:
        elapsed = time.time() - self.run_started - self.paused_s
        return min(1.0, (self.prior_productive + productive_this_attempt) / elapsed) if elapsed > 0 else 0.0


@dataclass(frozen=True)
class Event:
    """How one attempt ended and how the next one went on: ``kind`` is its ending (``endings``); only a spot
    interruption (``spot``) counts as an interruption."""

    kind: str
    reason: str  # the evidence for ``kind``
    step: int
    lost_steps: int  # trained by the interrupted attempt past the step resumed from, as its records show
    lost_steps_at_most: int  # equal to lost_steps where that is exact (a committed notice flushes every record)
    recovery_s: float | None  # interruption -> first step of the next attempt
    resumed_from: int
    interrupted_at: float  # UNIX time
    from_snapshot: bool  # the next attempt restored ``resumed_from`` from the snapshots' memory, not from storage

    @property
    def spot(self) -> bool:
        return self.kind in endings.SPOT

    def to_dict(self) -> dict:
        return {"kind": self.kind, "reason": self.reason, "spot": self.spot, "step": self.step,
                "lost_steps": self.lost_steps,
                "lost_steps_at_most": self.lost_steps_at_most,
                "recovery_s": None if self.recovery_s is None else round(self.recovery_s, 2),
                "resumed_from": self.resumed_from, "from_snapshot": self.from_snapshot}


def resumed_point(resumed_from: int, from_snapshot: bool) -> str:
    """Where the next attempt resumed, as every report says it."""
    return f"step {resumed_from}" + (" (a snapshot in memory)" if from_snapshot else "")


@dataclass(frozen=True)
class Account:
    seconds: dict[str, float]
    total_s: float
    events: list[Event]
    started_at: float  # UNIX time the run started
    kept: dict[int, ledger.StepRecord]  # the final model's history so far (``ledger.lineage``)
    paused_s: float = 0.0  # from a stop or a finish to the rerun: not the run's time, so not in ``total_s``

    @property
    def interruptions(self) -> list[Event]:
        """The spot interruptions: what counts as one everywhere."""
        return [e for e in self.events if e.spot]

    @property
    def goodput(self) -> float:
        return self.seconds["productive"] / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {"goodput": round(self.goodput, 4), "total_s": round(self.total_s, 2),
                "seconds": {k: round(v, 2) for k, v in self.seconds.items()}, "paused_s": round(self.paused_s, 2),
                "interruptions": len(self.interruptions),
                "lost_steps": sum(e.lost_steps for e in self.events),
                "lost_steps_at_most": sum(e.lost_steps_at_most for e in self.events),
                "events": [e.to_dict() for e in self.events]}


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt as its ledger has it; ``steps`` may be left empty, its status then says how far it got.
    ``finished``: its ``final.json`` is there; ``recorded``: the driver's ``ending.json``."""

    info: ledger.AttemptInfo
    status: dict | None
    steps: dict[int, ledger.StepRecord]
    finished: bool = False
    recorded: dict | None = None

    @property
    def ending(self) -> endings.Ending:
        return endings.of_attempt(self.status, self.finished, self.recorded)

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
    return [attempt_record(root, a, steps=a.attempt_id != starting, status=a.attempt_id != starting)
            for a in ledger.read_attempts(root)]


def attempt_record(root: Location, info: ledger.AttemptInfo, steps: bool = True, status: bool = True
                   ) -> AttemptRecord:
    """One attempt's records; ``steps``/``status`` False leave those out (a reader that needs only the ending)."""
    return AttemptRecord(info, read_status(root, info.attempt_id) if status else None,
                         ledger.read_steps(root, info.attempt_id) if steps else {},
                         ledger.attempt_finished(root, info.attempt_id), endings.read(root, info.attempt_id))


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
        for category in CLOCKED:
            seconds[category] += a.status_of(f"{category}_s")
        seconds["waiting"] += a.status_of("drain_wait_s")
    events = [interruption(prev, cur) for prev, cur in zip(attempts, attempts[1:], strict=False)]
    paused = 0.0
    for prev, cur, event in zip(attempts, attempts[1:], events, strict=False):
        gap = max(0.0, cur.entered_at - prev.last_seen)
        if event.kind in endings.PAUSES:
            paused += gap
        else:
            seconds["waiting"] += gap
    total = max(a.last_seen for a in attempts) - started - paused
    seconds["other"] = max(0.0, total - sum(seconds.values()))
    return Account(seconds, total, events, started, kept, paused)


def interruption(prev: AttemptRecord, cur: AttemptRecord) -> Event:
    """How ``prev`` ended and how ``cur`` went on from it (``recovery_s`` None until ``cur`` trained a step, and for
    a stop or a finish, which are no interruption)."""
    ending = prev.ending
    notice = prev.status_of("notice", None)
    interrupted_at = notice["at"] if notice else prev.last_seen
    step = notice["step"] if notice else prev.last_step
    resumed_at = cur.status_of("first_step_at", None)
    recovery = resumed_at - interrupted_at if resumed_at and not ending.pause else None
    lost = max(0, prev.last_step - cur.info.from_step)
    # Step records are written once per log interval, in the background: a kill can take the interval being
    # trained and the one being written with it. A committed notice, a finish and a resize wrote them all.
    unrecorded = 0 if (notice and notice["committed"]) or ending.kind in (endings.FINISHED, endings.RESIZE) else (
        2 * int(prev.status_of("log_every", 1)) - 1)
    return Event(ending.kind, ending.reason, step, lost, lost + unrecorded, recovery, cur.info.from_step,
                 interrupted_at, bool(cur.status_of("from_snapshot", False)))
