"""The driver's live view of a run, read from the ledger rank 0 keeps in storage: a progress line, one line per
interruption and per recovery, and one when the workers wait for capacity."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from spotray.accounts import endings, goodput, ledger
from spotray.errors import SpotrayError
from spotray.formats import clock, step_count, step_of, workers
from spotray.storage import Location

if TYPE_CHECKING:
    from spotray.driver.node_watch import NodeWatch
    from spotray.driver.placement import Placement

WAITING_AFTER_S = 10.0  # a placement that takes longer is waiting for nodes, not being scheduled
EVIDENCE_WAIT_S = 15.0  # for why an attempt ended (the node watch's record), after the next one trained
_EMERGENCY_SAVES = {"checkpoint": "emergency checkpoint committed",
                    "snapshot": "emergency snapshot committed, in the memory of the nodes that stay"}


def progress_line(status: dict, tokens_per_step: int) -> str:
    step, total = status.get("step") or 0, status["max_steps"]
    parts = [f"step {step_of(step, total)}"]
    if status.get("loss") is not None:
        parts.append(f"loss {status['loss']:.4f}")
    if status.get("val_loss") is not None:
        parts.append(f"val {status['val_loss']:.4f}")
    tokens_per_s = status.get("tokens_per_s")
    if tokens_per_s:
        parts.append(f"{tokens_per_s:,.0f} tok/s")
    if status.get("goodput") is not None:
        parts.append(f"goodput {100 * status['goodput']:.0f}%")
    if tokens_per_s and total and step < total:
        parts.append(f"ETA {clock((total - step) * tokens_per_step / tokens_per_s)}")
    return " | ".join(parts)


class ProgressMonitor:
    """Polls the run's attempts while ``fit`` runs; a TTY gets one rewritten line, a log a line every 10 s.
    ``placement`` (``placement.worker_group_placement`` bound to the run's scaling) tells when Ray has been unable to
    place the worker group for ``WAITING_AFTER_S``: one line per wait."""

    def __init__(self, attempts_root: Location, tokens_per_step: int, stream=None, interval_s: float = 2.0,
                 placement: Callable[[], Placement | None] | None = None, nodes: NodeWatch | None = None):
        self.root, self.tokens_per_step = attempts_root, tokens_per_step
        self.nodes = nodes  # looks up the nodes each new attempt names, and records the ones lost
        self.placement = placement
        self._waiting_since: float | None = None
        self._waiting_said = False
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self.tty = self.stream.isatty()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="spotray-progress")
        self._announced: set[tuple[str, str]] = set()
        self._known: dict[str, ledger.AttemptInfo] = {}
        self._ended: dict[str, dict | None] = {}  # the statuses of attempts a newer one followed: final
        self._skip = {a.attempt_id for a in self._attempts()}  # earlier runs of this name were reported then
        self._last_line, self._last_print = "", 0.0
        self._val_loss: float | None = None  # the last evaluation's, until the attempt now training evaluates

    def __enter__(self) -> ProgressMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        # Not Ray's placement: the run may have ended because the head is gone, and Ray's state calls would then
        # block until Ray ends the process.
        self.poll(capacity=False)
        if self.tty and self._last_line:
            self.stream.write("\n")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except (SpotrayError, OSError, ValueError, KeyError):
                pass  # storage hiccup or a record mid-write: the next poll catches up

    def _attempts(self) -> list[ledger.AttemptInfo]:
        return ledger.read_attempts(self.root, self._known)

    def poll(self, capacity: bool = True) -> None:
        attempts = self._attempts()
        if capacity and not _going_on_smaller(attempts, self._status):
            self._capacity()
        if self.nodes:
            self.nodes.poll(attempts, ask_ray=capacity)
        statuses = {a.attempt_id: self._status(a.attempt_id, ended=a is not attempts[-1]) for a in attempts[-2:]}
        if len(attempts) >= 2 and attempts[-1].attempt_id not in self._skip:
            prev, prev_status = attempts[-2], statuses[attempts[-2].attempt_id]
            if prev_status and prev.attempt_id not in self._skip:  # its notice may have come and gone within a poll
                self._notice(prev.attempt_id, prev_status)
            self._interruption(prev, prev_status, attempts[-1], statuses[attempts[-1].attempt_id])
        if attempts and attempts[-1].attempt_id not in self._skip:
            current = statuses[attempts[-1].attempt_id]
            if current:  # its last progress line is of a step before its notice
                self._progress(current, attempts[-1].attempt_id)
                self._notice(attempts[-1].attempt_id, current)

    def _status(self, attempt_id: str, ended: bool) -> dict | None:
        """An attempt's status; read once after a newer attempt started, since Ray stopped its workers first."""
        if attempt_id in self._ended:
            return self._ended[attempt_id]
        status = goodput.read_status(self.root, attempt_id)
        if ended:
            self._ended[attempt_id] = status
        return status

    def _notice(self, attempt_id: str, status: dict) -> None:
        notice = status.get("notice")
        if notice and self._once(attempt_id, "notice"):
            outcome = (_EMERGENCY_SAVES[notice.get("kept_in", "checkpoint")] if notice["committed"] else
                       "no emergency checkpoint: the restart resumes from the last committed one")
            self._say(f"PREEMPTION NOTICE at step {notice['step']}: {outcome}")
        if notice and status.get("moved_at") and self._once(attempt_id, "moved"):
            self._say(f"MOVING ON from step {notice['step']}: the workers go on without the node, "
                      f"{status['moved_at'] - notice['at']:.1f}s after the notice, without waiting for it to go")

    def _interruption(self, prev: ledger.AttemptInfo, prev_status: dict | None, cur: ledger.AttemptInfo,
                      cur_status: dict | None) -> None:
        """One line for how ``prev`` ended, once its ending is on record or ``cur`` trained (then it is unknown: no
        evidence came), and one for how ``cur`` went on."""
        if {(prev.attempt_id, "ended"), (cur.attempt_id, "resumed")} <= self._announced:
            return
        event = self._event(prev, prev_status, cur, cur_status, steps=False)
        first_step_at = (cur_status or {}).get("first_step_at")
        # The survivors may train again before Ray has marked the lost node dead: the why has a while to come, and
        # replaces the driver's start again.
        evidence_over = first_step_at is not None and time.time() - first_step_at >= EVIDENCE_WAIT_S
        if event.kind in (endings.UNKNOWN, endings.RESTARTED):  # provisional
            due = evidence_over
        else:  # a pause, once the rerun trains: a rerun that trains nothing (a finished script's) continued nothing
            due = first_step_at is not None or event.kind not in endings.PAUSES
        if due and self._once(prev.attempt_id, "ended"):
            line = _ending_line(self._event(prev, prev_status, cur, cur_status))
            if line:
                self._say(line)
        if (not first_step_at or (prev.attempt_id, "ended") not in self._announced
                or not self._once(cur.attempt_id, "resumed")):
            return
        event = self._event(prev, prev_status, cur, cur_status)
        if event.recovery_s is None:  # a stop or a finish, then a rerun: the run was not interrupted
            self._say(f"CONTINUING from step {event.resumed_from} on {workers(cur.world_size)}, {_lost(event)}")
        elif event.kind == endings.RESIZE:
            self._say(f"GREW to {workers(cur.world_size)} from {_resumed(event)}: {_room(cur)}; "
                      f"{event.recovery_s:.1f}s from the last step, {_lost(event)}")
        elif cur.world_size < prev.world_size:
            self._say(f"SHRUNK to {workers(cur.world_size)} from {_resumed(event)}: going on without the lost "
                      f"node's workers; {event.recovery_s:.1f}s after the interruption, {_lost(event)}; "
                      "growing back when capacity returns")
        else:
            self._say(f"RESUMED from {_resumed(event)} on {workers(cur.world_size)}, "
                      f"{event.recovery_s:.1f}s after the interruption, {_lost(event)}")

    def _event(self, prev: ledger.AttemptInfo, prev_status: dict | None, cur: ledger.AttemptInfo,
               cur_status: dict | None, steps: bool = True) -> goodput.Event:
        """How ``prev`` ended and ``cur`` went on; ``steps``: from ``prev``'s step records, as `spotray status` counts
        (its status may be a log interval behind them: a kill can land between the two writes), read for a line
        about to be said, not at every poll."""
        record = replace(goodput.attempt_record(self.root, prev, steps=steps, status=False), status=prev_status)
        return goodput.interruption(record, goodput.AttemptRecord(cur, cur_status, {}))

    def _capacity(self) -> None:
        """A wait ends when the group is placed; between Ray Train's tries to place it there may be no group."""
        try:
            placement = self.placement() if self.placement else None
        except Exception:  # noqa: BLE001 - advisory: a cluster going away is reported by the run itself
            return
        if placement is None:
            return
        if placement.placed:
            self._waiting_since, self._waiting_said = None, False
            return
        now = time.monotonic()
        self._waiting_since = self._waiting_since or now
        if not self._waiting_said and now - self._waiting_since >= WAITING_AFTER_S:
            self._waiting_said = True
            self._say(f"WAITING for capacity: {placement.waiting_for}; training goes on when nodes join")

    def _once(self, attempt_id: str, what: str) -> bool:
        key = (attempt_id, what)
        if key in self._announced:
            return False
        self._announced.add(key)
        return True

    def _say(self, text: str) -> None:
        self.stream.write(("\r\033[K" if self.tty else "") + f"spotray: {text}\n")
        if self.tty:
            self._last_line = ""  # the event's line took the progress line's place: draw it again
        self.stream.flush()

    def _progress(self, status: dict, attempt_id: str) -> None:
        if status.get("step") is None:
            return  # this attempt has not logged a step yet
        notice = status.get("notice")
        if notice and status["step"] < notice["step"] and (attempt_id, "notice") in self._announced:
            return  # a step before the notice already said: the next line is of the run that goes on
        if status.get("val_loss") is not None:
            self._val_loss = status["val_loss"]
        line = progress_line({**status, "val_loss": self._val_loss}, self.tokens_per_step)
        now = time.monotonic()
        if line == self._last_line or (not self.tty and now - self._last_print < 10):
            return
        self._last_line, self._last_print = line, now
        self.stream.write(f"\r\033[K{line}" if self.tty else f"spotray: {line}\n")
        self.stream.flush()


def _going_on_smaller(attempts: list[ledger.AttemptInfo], status: Callable[..., dict | None]) -> bool:
    """Whether the run trains below its configured size: Ray waits to place the rest, and training goes on."""
    if not attempts or attempts[-1].world_size >= attempts[-1].configured_workers:
        return False
    return bool((status(attempts[-1].attempt_id, ended=False) or {}).get("first_step_at"))


def _ending_line(event: goodput.Event) -> str | None:
    """How an attempt ended, in one line (a notice has its own lines, from the attempt itself)."""
    if event.kind in (endings.NOTICE, endings.RESIZE):  # they have their own lines
        return None
    if event.kind == endings.ERROR:
        return f"FAILURE at step {event.step}: {event.reason}"
    if event.kind in endings.PAUSES:
        return f"the run was {endings.DESCRIPTIONS[event.kind]} at step {event.step}: not an interruption"
    what = "SPOT INTERRUPTION without notice" if event.spot else "INTERRUPTED"
    detail = "" if event.reason == endings.DESCRIPTIONS[event.kind] else f" ({event.reason})"
    return f"{what} at step {event.step}: {endings.DESCRIPTIONS[event.kind]}{detail}"


def _resumed(event: goodput.Event) -> str:
    return goodput.resumed_point(event.resumed_from, event.from_snapshot)


def _room(grown: ledger.AttemptInfo) -> str:
    if grown.world_size < grown.configured_workers:
        return f"room for more workers was back (growing to {grown.configured_workers} once all fit)"
    return "capacity for the whole group was back"


def _lost(event: goodput.Event) -> str:
    """Lost steps as counted, and their bound where the count may miss unwritten records."""
    if event.lost_steps_at_most == event.lost_steps:
        return f"{step_count(event.lost_steps)} lost"
    return f"{step_count(event.lost_steps)} lost by the records, at most {event.lost_steps_at_most}"
