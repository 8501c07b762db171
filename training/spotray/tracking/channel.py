"""One tracker fed from the ledger: its cursor, and what happens while the tracker cannot be reached.

Nothing waits on a tracker but this: the ledger keeps every point, so a row that could not be sent is simply sent
again at the next poll, as the same point (its first-send time), until it goes or it is past the retry bound."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from spotray.tracking.feed import Row, Snapshot
from spotray.tracking.state import Cursor, TrackingState

log = logging.getLogger(__name__)

RETRY_FOR_S = 300.0  # a row that cannot be sent is retried for this long after its first try ...
MAX_PENDING_POINTS = 100_000  # ... and while at most this many points wait; beyond either, the oldest are dropped


class Sink(Protocol):
    """A tracker run opened for writing; ``logged_step`` is the last step it says it holds, where it can say."""

    logged_step: int | None

    def params(self, params: dict[str, str]) -> None: ...
    def rows(self, rows: list[Row]) -> None: ...
    def events(self, events: list[dict], new_from: int) -> None: ...
    def summary(self, scalars: dict) -> None: ...
    def flush(self) -> None: ...
    def close(self, finished: bool) -> None: ...


class Channel:
    """Sends one tracker what its cursor says it lacks, at each poll, and rides out the tracker's outages."""

    def __init__(self, name: str, where: str, open_sink: Callable[[Cursor], Sink], state: TrackingState,
                 warn: Callable[[str], None], retry_for_s: float = RETRY_FOR_S,
                 max_pending_points: int = MAX_PENDING_POINTS):
        self.name, self.where, self.open_sink = name, where, open_sink
        self.state, self.cursor, self.warn = state, state.cursor(name), warn
        self.retry_for_s, self.max_pending_points = retry_for_s, max_pending_points
        self.sink: Sink | None = None
        self.failing = False
        self.failing_since: float | None = None  # when this outage began
        self._first_sent: dict[int, float] = {}  # step -> when its row was first tried, until it goes or is dropped
        self._gap: dict | None = None  # this outage's entry in state.gaps, grown while the outage lasts

    @property
    def key(self) -> str:
        return f"tracking.{self.name}"

    def feed(self, snapshot: Snapshot, params: dict[str, str], now: float) -> bool:
        """Sends what the tracker lacks of ``snapshot``; True when it holds all of it (or dropped what was due)."""
        try:
            rows = snapshot.rows_after(self.cursor.logged_step, lambda step: self._first_sent.setdefault(step, now))
            self._send(snapshot, self._drop_overdue(rows, now) if self.failing else rows, params)
        except Exception as exc:  # noqa: BLE001 - whatever a tracker's client raises, training goes on
            self._failed(exc, now)
            return False
        self.failing, self.failing_since, self._gap = False, None, None
        self._first_sent.clear()
        return True

    def give_up(self, snapshot: Snapshot) -> None:
        """The run ends while the tracker is still down: what it lacks is dropped into a gap, unsent."""
        if self.failing:
            rows = snapshot.rows_after(self.cursor.logged_step, lambda step: self._first_sent.get(step, 0.0))
            if rows:
                self._record_gap(rows)

    def finish(self, scalars: dict) -> None:
        """The run finished: its summary, then the tracker run closed as finished (not tried while failing)."""
        if self.sink is None or self.failing:
            return
        try:
            if scalars["final_step"] > self.cursor.summary_step:
                self.sink.summary(scalars)
                self.cursor.summary_step = scalars["final_step"]
            self.sink.close(finished=True)
        except Exception as exc:  # noqa: BLE001
            log.info("%s: could not finish the tracker run: %s", self.key, exc)

    def close(self) -> None:
        """The driver stops without the run finishing: the tracker run is left for a rerun to continue."""
        try:
            if self.sink is not None:
                self.sink.close(finished=False)
        except Exception as exc:  # noqa: BLE001
            log.info("%s: could not close the tracker run: %s", self.key, exc)

    def _send(self, snapshot: Snapshot, rows: list[Row], params: dict[str, str]) -> None:
        if self.sink is None:
            self.sink = self.open_sink(self.cursor)
            self.cursor.logged_step = max(self.cursor.logged_step, self.sink.logged_step or 0)
        rows = [row for row in rows if row.step > self.cursor.logged_step]
        if not self.cursor.params:
            self.sink.params(params)
            self.cursor.params = True
        if rows:
            self.sink.rows(rows)
            self.cursor.logged_step = rows[-1].step
        if len(snapshot.events) > self.cursor.events:
            self.sink.events([event.to_dict() for event in snapshot.events], self.cursor.events)
            self.cursor.events = len(snapshot.events)
        self.sink.flush()

    def _failed(self, exc: Exception, now: float) -> None:
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        log.info("%s: cannot send to %s: %s", self.key, self.where, reason)
        if not self.failing:
            self.failing_since = now
            self.warn(f"{self.key}: cannot send to {self.where} ({reason}); training goes on, and what is unsent "
                      f"is retried for up to {self.retry_for_s:g} s, {self.max_pending_points} points at most (what "
                      "is dropped is listed in the summary's tracking_gaps)")
        self.failing = True

    def _drop_overdue(self, rows: list[Row], now: float) -> list[Row]:
        """Rows are tried in step order, so the overdue ones (too old, or too many points waiting) come first."""
        waiting = sum(row.points for row in rows)
        dropped = 0
        for row in rows:
            if now - row.time <= self.retry_for_s and waiting <= self.max_pending_points:
                break
            waiting -= row.points
            dropped += 1
        if dropped:
            self._record_gap(rows[:dropped])
        return rows[dropped:]

    def _record_gap(self, rows: list[Row]) -> None:
        points = sum(row.points for row in rows)
        if self._gap is None:
            self._gap = {"tracker": self.name, "first_step": rows[0].step, "last_step": rows[-1].step, "points": 0}
            self.state.gaps.append(self._gap)
        self._gap.update(last_step=rows[-1].step, points=self._gap["points"] + points)
        self.cursor.logged_step = rows[-1].step
        for row in rows:
            self._first_sent.pop(row.step, None)
        log.info("%s: dropped steps %d-%d (%d points) after retrying them", self.key, rows[0].step, rows[-1].step,
                 points)
