"""How long checkpoint saves may keep failing (a storage outage), and when the next try is due: pure arithmetic
over steps and seconds, so that ``Checkpointer`` only reports what happened."""

from __future__ import annotations

MAX_FINAL_WAIT_S = 30.0  # between tries of the final commit, which cannot move on to a later step


class SaveFailureBudget:
    """A failed save is tried again after a gap of steps that doubles with each failure in a row, up to
    ``max_gap``; the run may go on failing for ``budget_s`` seconds. A success starts over."""

    def __init__(self, budget_s: float, max_gap: int):
        self.budget_s, self.max_gap = budget_s, max_gap
        self.failed_saves = 0  # in this attempt, successes between them included
        self.in_a_row = 0
        self.failing_since: float | None = None
        self.retry_at: int | None = None

    def failed(self, step: int, now: float) -> None:
        """The save of ``step`` failed at time ``now``."""
        self.failed_saves += 1
        self.in_a_row += 1
        if self.failing_since is None:
            self.failing_since = now
        self.retry_at = step + min(2 ** (self.in_a_row - 1), self.max_gap)

    def seconds_failing(self, now: float) -> float:
        return 0.0 if self.failing_since is None else now - self.failing_since

    def exhausted(self, seconds_failing: float) -> bool:
        return seconds_failing >= self.budget_s

    def saving(self) -> None:
        """A save starts: whatever retry was due is now under way."""
        self.retry_at = None

    def succeeded(self) -> int:
        """A save committed; returns how many had failed in a row before it."""
        failed, self.in_a_row, self.failing_since, self.retry_at = self.in_a_row, 0, None, None
        return failed

    def retry_due(self, step: int) -> bool:
        return self.retry_at is not None and step >= self.retry_at

    def final_wait_s(self) -> float:
        """How long the final commit waits before it tries again."""
        return min(2.0 ** self.in_a_row, MAX_FINAL_WAIT_S)
