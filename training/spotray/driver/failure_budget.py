"""spotray's retry budgets, kept inside Ray Train's controller and charged from each attempt's ending on record.

Ray Train counts a node lost without its own drain as a real failure (only a death Ray drained as preempted is a
preemption there), so a spot run's 4th kill would spend ``max_failures=3``. Ray is therefore given no limits of its
own; this callback ends the run (a non-retryable ``ControllerError``) when spotray's budgets are spent: endings that
are not spot interruptions against ``fault_tolerance.max_failures``, spot interruptions against ``max_preemptions``;
a failure that a restart repeats (a config error, no checkpoint that can be read) ends it at once. The restart
itself stays Ray's, as fast as for any other failure."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from ray.train.v2._internal.execution.callback import ControllerCallback
from ray.train.v2._internal.execution.controller.state import RestartingState

from spotray.accounts import endings, goodput, ledger
from spotray.config import FaultToleranceSection
from spotray.errors import ConfigError, SpotrayError, Unrestorable, root_cause
from spotray.storage import Location, StorageOptions, resolve

KILL_EVIDENCE_WAIT_S = 45.0  # Ray marks a lost node dead after its health checks fail (about 15 s by default)
# Failures a restart repeats (the same config, the same bytes): the run ends at the first, whatever the budget.
NOT_RETRIED = tuple(f"{error.__module__}.{error.__qualname__}: " for error in (ConfigError, Unrestorable))
SPOT_VERBS = {endings.NOTICE: "moved on a preemption notice", endings.KILL: "lost a spot node"}


class BudgetSpent(Exception):
    """The run's budget is spent; its text is the one line the user sees."""


@dataclass(frozen=True)
class Charges:
    """This driver's attempts' endings, as the budgets count them."""

    failures: int  # not spot interruptions, with failures before an attempt recorded itself
    spot: int
    last: endings.Ending | None


def charges(attempts: Location, since: float, unrecorded: int) -> Charges:
    ended = [goodput.attempt_record(attempts, info, steps=False).ending
             for info in ledger.read_attempts(attempts) if info.started_at >= since]
    mine = [ending for ending in ended if ending.kind not in endings.UNCHARGED]
    spot = sum(ending.spot for ending in mine)
    return Charges(len(mine) - spot + unrecorded, spot, mine[-1] if mine else None)


def verdict(budgets: FaultToleranceSection, run_name: str, counted: Charges, cause: str) -> str | None:
    """Why the run must end (the line the user sees: ``cause``, the failure's own), or None while both budgets hold."""
    if 0 <= budgets.max_failures < counted.failures:
        return cause
    return preemptions_spent(budgets, run_name, counted)


def preemptions_spent(budgets: FaultToleranceSection, run_name: str, counted: Charges) -> str | None:
    if not 0 <= budgets.max_preemptions < counted.spot:
        return None
    how = SPOT_VERBS.get(counted.last.kind, "was interrupted") if counted.last else "was interrupted"
    return (f"training run '{run_name}' restarted {counted.spot} times after spot interruptions (the last: it {how}), "
            f"over fault_tolerance.max_preemptions={budgets.max_preemptions}; raise it (-1: no limit) and run the "
            "same command again to resume")


class FailureBudget(ControllerCallback):
    """Charges every restart Ray Train is about to make to spotray's budgets; ``since``: when this driver started."""

    def __init__(self, attempts_url: str, storage: StorageOptions, budgets: FaultToleranceSection, run_name: str,
                 since: float):
        self.attempts_url, self.storage, self.budgets = attempts_url, storage, budgets
        self.run_name, self.since = run_name, since
        self._newest: str | None = None
        self._unrecorded = 0

    def after_controller_start(self, train_run_context) -> None:
        with contextlib.suppress(SpotrayError, OSError):  # unreadable: the first failure is then judged as recorded
            self._newest = self._newest_id()

    def after_controller_state_update(self, previous_state, current_state) -> None:
        """Ray Train wraps what this raises in a ``ControllerError``, which it never retries."""
        if not isinstance(current_state, RestartingState):
            return
        cause = root_cause(current_state.training_failed_error)
        if cause.startswith(NOT_RETRIED):
            raise BudgetSpent(cause.split(": ", 1)[1])
        try:
            why = self._charge(cause)
        except (SpotrayError, OSError) as exc:  # the ledger is unreadable: a failure, as Ray alone would count it
            self._unrecorded += 1
            why = verdict(self.budgets, self.run_name, Charges(self._unrecorded, 0, None),
                          f"{cause} (and the run's ledger could not be read: {root_cause(exc)})")
        if why:
            raise BudgetSpent(why)

    def _charge(self, cause: str) -> str | None:
        newest = self._newest_id()
        if newest == self._newest:  # the group failed before its attempt recorded itself
            self._unrecorded += 1
        self._newest = newest
        return self.judge(cause)

    def judge(self, cause: str) -> str | None:
        """The verdict on the newest attempt; where its ending is not on record yet and decides the verdict (a lost
        node's evidence follows Ray's failure), waits for it up to ``KILL_EVIDENCE_WAIT_S``."""
        attempts = resolve(self.attempts_url, self.storage)
        deadline = time.monotonic() + KILL_EVIDENCE_WAIT_S
        while True:
            counted = charges(attempts, self.since, self._unrecorded)
            why = verdict(self.budgets, self.run_name, counted, cause)
            pending = counted.last is not None and counted.last.kind == endings.UNKNOWN
            if not pending or time.monotonic() > deadline:
                return why
            as_spot = Charges(counted.failures - 1, counted.spot + 1, endings.Ending(endings.KILL, ""))
            if (why is None) == (verdict(self.budgets, self.run_name, as_spot, cause) is None):
                return why  # the same either way
            time.sleep(1.0)

    def _newest_id(self) -> str | None:
        newest = ledger.read_attempts(resolve(self.attempts_url, self.storage))[-1:]
        return newest[0].attempt_id if newest else None
