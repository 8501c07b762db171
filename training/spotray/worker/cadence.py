"""When an attempt checkpoints, when it asks about preemptions, and what it does on a notice: one core for
spotray's own loop and for a user's script (``spotray.should_save`` / ``commit`` / ``should_stop``).

``checkpoint.every_steps`` is a fixed count, or ``auto``: the Young–Daly interval from the saves this attempt has
timed and ``fault_tolerance.expected_interruptions_per_hour``, re-evaluated after every save and logged when it
changes. A preemption notice triggers its emergency checkpoint whatever the interval.
``fault_tolerance.preemption_check_every_steps`` is a fixed count, or ``auto``: about every ``CHECK_EVERY_S``.

Every decision here is a collective taken alike on every rank: rank 0's view (or the slowest rank's timing) wins."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from spotray.config import AUTO, TrainConfig

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

UNMEASURED_EVERY_STEPS = 50  # ``auto`` before an attempt has timed a save
# A notice leaves tens of seconds (two minutes on EC2); each check is a barrier through a Ray actor (~3 ms on CPU).
CHECK_EVERY_S = 1.0


def nominal_every_steps(every_steps: int | str) -> int:
    """The interval in steps before anything is measured."""
    return UNMEASURED_EVERY_STEPS if every_steps == AUTO else int(every_steps)


def young_daly_s(blocking_save_s: float, mean_time_between_interruptions_s: float) -> float:
    """The interval between checkpoints, in seconds of training, that minimises the expected lost work plus the
    time saves block training, to first order (Young 1974, Daly 2006): sqrt(2 x save x MTBI)."""
    if blocking_save_s < 0 or mean_time_between_interruptions_s <= 0:
        raise ValueError(f"need save >= 0 and MTBI > 0 seconds, got {blocking_save_s}, "
                         f"{mean_time_between_interruptions_s}")
    return math.sqrt(2 * blocking_save_s * mean_time_between_interruptions_s)


def interval_steps(blocking_save_s: float, save_s: float, step_s: float, interruptions_per_hour: float,
                   max_steps: int) -> int:
    """Young–Daly in steps of ``step_s``, at least one step and at most ``max_steps``, and never shorter than a
    whole save (``save_s`` end to end: an asynchronous save must finish before the next one can start)."""
    seconds = max(young_daly_s(blocking_save_s, 3600 / interruptions_per_hour), save_s)
    return max(1, min(max_steps, round(seconds / step_s))) if step_s > 0 else max_steps


class CheckpointInterval:
    """Whether a step is due for a checkpoint. Fixed: every multiple of ``every_steps``. ``auto``: once
    ``steps`` have passed since the last checkpoint, where ``steps`` follows the measured saves."""

    def __init__(self, every_steps: int | str, interruptions_per_hour: float, max_steps: int, start_step: int):
        self.auto = every_steps == AUTO
        self.steps = nominal_every_steps(every_steps)
        self.interruptions_per_hour, self.max_steps = interruptions_per_hour, max_steps
        self.last_checkpoint_step = start_step
        if self.auto:
            log.info("checkpoint.every_steps=auto: every %d steps until this attempt has timed a save", self.steps)

    def due(self, step: int) -> bool:
        if self.auto:
            return step - self.last_checkpoint_step >= self.steps
        return step % self.steps == 0

    def checkpointed(self, step: int, blocking_save_s: float, save_s: float, step_s: float) -> None:
        """A checkpoint at ``step`` blocked training ``blocking_save_s`` (every rank must pass the same values)."""
        self.last_checkpoint_step = step
        if not self.auto:
            return
        steps = interval_steps(blocking_save_s, save_s, step_s, self.interruptions_per_hour, self.max_steps)
        if steps != self.steps:
            log.info("checkpoint interval: every %d steps (was %d): a save blocks %.2f s of %.2f s, a step takes "
                     "%.3f s, %g interruptions expected per hour", steps, self.steps, blocking_save_s, save_s,
                     step_s, self.interruptions_per_hour)
            self.steps = steps


SNAPSHOT_BUDGET = 0.02  # of the step time, at most, that snapshots may cost training under ``auto``
# ``auto``'s interval until an attempt has timed a snapshot: a copy is assumed to cost a step (``snapshot_cost_s``), so
# the first comes once one step fits the budget. Taken at step 10, it cost a 20-step run on 2 cores about 9 %.
UNMEASURED_SNAPSHOT_STEPS = math.ceil(1 / SNAPSHOT_BUDGET)


def snapshot_cost_s(blocked_s: float, slowed_s: float, step_s: float, copy_timed: bool) -> float:
    """What a snapshot costs training: its blocking part and the seconds the previous copy slowed the steps it
    overlapped (``SnapshotSlowdown``). Before an attempt has timed a copy (its first snapshot), the copy is assumed to
    slow training by a step, not by nothing: on a 2-core node it cost 0.96 s at 0.97 s a step, and taking the blocking
    part alone for the cost put the second snapshot 16 steps after the first."""
    return blocked_s + (slowed_s if copy_timed else step_s)


def snapshot_interval_steps(cost_s: float, whole_s: float, step_s: float, interruptions_per_hour: float) -> int:
    """``auto``'s snapshot interval: Young–Daly at what a snapshot costs training and the run's interruption rate, but
    never so often that snapshots cost more than ``SNAPSHOT_BUDGET`` of the step time, nor shorter than a whole
    snapshot (the next waits for the last)."""
    seconds = max(cost_s / SNAPSHOT_BUDGET, whole_s)
    if interruptions_per_hour > 0:
        seconds = max(seconds, young_daly_s(cost_s, 3600 / interruptions_per_hour))
    return max(1, math.ceil(seconds / step_s))


def snapshot_spacing(snapshot_steps: int, checkpoint_steps: int) -> int | None:
    """Steps between ``auto``'s snapshots: ``snapshot_steps`` stretched so that a whole number of them fills each
    checkpoint interval, the last with its checkpoint, never more of them than the interval allows; None where it does
    not fit in a checkpoint interval (the checkpoints come more often than the budget allows snapshots)."""
    if snapshot_steps > checkpoint_steps:
        return None
    return math.ceil(checkpoint_steps / (checkpoint_steps // snapshot_steps))


class SnapshotInterval:
    """Whether a step is due for a snapshot. Fixed: every multiple of ``every_steps``. ``auto``: the interval
    ``snapshot_interval_steps`` gives, spread evenly over each checkpoint interval it fits in, no more snapshots than
    it allows. Either way a checkpoint's step is also kept in memory wherever the interval fits in the checkpoints', so
    that a kill just after a checkpoint reads nothing from storage either."""

    def __init__(self, every_steps: int | str, interruptions_per_hour: float, start_step: int):
        self.auto = every_steps == AUTO
        self.steps = UNMEASURED_SNAPSHOT_STEPS if self.auto else int(every_steps)
        self.interruptions_per_hour, self.last_step = interruptions_per_hour, start_step
        self.timed_alone = False  # a copy's cost has been timed with no checkpoint's write beside it
        self.first_taken = False  # this attempt has taken a snapshot

    def due(self, step: int, at_checkpoint_interval: bool, checkpoint_every: int) -> bool:
        """``at_checkpoint_interval``: ``step`` is the checkpoint interval's; ``checkpoint_every``: that interval.
        Under ``auto`` an attempt's first, untimed copy waits its ``UNMEASURED_SNAPSHOT_STEPS``, at a checkpoint too."""
        if at_checkpoint_interval and self.steps <= checkpoint_every:
            return not (self.auto and not self.first_taken and step - self.last_step < self.steps)
        if not self.auto:
            return step % self.steps == 0
        spacing = snapshot_spacing(self.steps, checkpoint_every)
        return spacing is not None and step - self.last_step >= spacing

    def taken(self, step: int, cost_s: float, whole_s: float, step_s: float, alone: bool = True) -> None:
        """A snapshot at ``step`` cost training ``cost_s`` and took ``whole_s`` end to end; the same values on every
        rank. ``alone``: False where the cost is not the copy's alone (assumed, before a copy is timed; or timed beside
        a checkpoint's write, so an upper bound): such a cost sets the interval only until one is timed alone."""
        self.last_step, self.first_taken = step, True
        if not self.auto or step_s <= 0 or self.timed_alone and not alone:
            return
        self.timed_alone = self.timed_alone or alone
        steps = snapshot_interval_steps(cost_s, whole_s, step_s, self.interruptions_per_hour)
        if steps != self.steps:
            log.info("snapshot interval: every %d steps (was %d): a snapshot costs training %.3f s and takes %.3f s, "
                     "a step takes %.3f s, %g interruptions expected per hour", steps, self.steps, cost_s, whole_s,
                     step_s, self.interruptions_per_hour)
            self.steps = steps


class SnapshotSlowdown:
    """What a snapshot's background copy costs the steps it overlaps: each such step counts the seconds it took beyond
    the mean of the steps that overlapped no background write (a checkpoint's neither: those count for neither). The
    copy shares the CPUs and the interpreter lock with training: on a 2-core node it slowed one step by 1.2 s. A copy
    that overlapped a checkpoint's write cannot be told apart from it: its steps' extra time is the two writes'."""

    def __init__(self):
        self.quiet_steps, self.quiet_s, self.extra_s = 0, 0.0, 0.0
        self.with_checkpoint = False

    def step(self, seconds: float, snapshot_copying: bool, checkpoint_writing: bool) -> None:
        if snapshot_copying:
            self.with_checkpoint = self.with_checkpoint or checkpoint_writing
            self.extra_s += max(0.0, seconds - self.quiet_s / self.quiet_steps) if self.quiet_steps else 0.0
        elif not checkpoint_writing:
            self.quiet_steps, self.quiet_s = self.quiet_steps + 1, self.quiet_s + seconds

    def take(self) -> tuple[float, bool]:
        """The extra seconds counted since the last take, and whether they are the copy's alone (no checkpoint's write
        overlapped it)."""
        taken = self.extra_s, not self.with_checkpoint
        self.extra_s, self.with_checkpoint = 0.0, False
        return taken


class PreemptionChecks:
    """Whether a step is due to ask Ray about preemptions. Fixed: every multiple of ``every_steps``. ``auto``: every
    step until a step is timed, then once ``CHECK_EVERY_S`` of steps have passed since the last check."""

    def __init__(self, every_steps: int | str):
        self.auto = every_steps == AUTO
        self.steps = 1 if self.auto else int(every_steps)
        self.last_check_step: int | None = None

    def due(self, step: int) -> bool:
        if self.auto:
            return self.last_check_step is None or step - self.last_check_step >= self.steps
        return step % self.steps == 0

    def checked(self, step: int, step_s: float) -> None:
        """Asked at ``step``; a step takes ``step_s`` on the slowest rank (every rank must pass the same value)."""
        self.last_check_step = step
        if self.auto and step_s > 0:
            self.steps = max(1, round(CHECK_EVERY_S / step_s))

PREEMPTION_WAIT_GRACE_S = 30.0
MOVE_ON_POLL_S = 1.0  # how often, after an emergency checkpoint, rank 0 looks for other capacity


class Cadence:
    """An attempt's schedule: a checkpoint at the interval (fixed or Young–Daly) and a preemption check about once
    a second. ``preemption_deadline`` is the launcher's (Ray's drain deadline, a collective)."""

    def __init__(self, cfg: TrainConfig, last_step: int, start_step: int, device: torch.device,
                 preemption_deadline: Callable[[], float | None]):
        self.interval = CheckpointInterval(cfg.checkpoint.every_steps, cfg.fault_tolerance.interruptions_per_hour,
                                           last_step, start_step)
        self.checks = PreemptionChecks(cfg.fault_tolerance.preemption_check_every_steps)
        self.last_step, self.device, self.preemption_deadline = last_step, device, preemption_deadline

    def save_due(self, step: int, retry_due: bool = False) -> bool:
        """At the checkpoint interval, or where a failed save's retry is due."""
        return self.interval.due(step) or retry_due

    def notice(self, step: int, step_s: float) -> float | None:
        """The drain deadline (UNIX time) where a notice has reached any rank, asked at the check cadence; None
        otherwise. ``step_s``: this rank's mean step time."""
        checks = self.checks
        if not checks.due(step) or step >= self.last_step:
            return None
        checks.checked(step, slowest_rank((step_s,), self.device)[0] if checks.auto else 0.0)
        return self.preemption_deadline()

    def saved(self, step: int, blocking_s: float, save_s: float, step_s: float) -> None:
        """A checkpoint of ``step`` blocked training ``blocking_s`` of a ``save_s`` save; steps take ``step_s``."""
        measured = (blocking_s, save_s, step_s)
        self.interval.checkpointed(step, *(slowest_rank(measured, self.device) if self.interval.auto else measured))


def too_short(deadline: float, last_save_s: float | None, agree: Callable) -> bool:
    """Whether the notice leaves less time than a save takes (rank 0's estimate decides for all ranks)."""
    remaining = deadline - time.time()
    short = agree(last_save_s is not None and remaining < 1.2 * last_save_s)
    if short:
        log.info("preemption in %.1fs is too short for a checkpoint (last save took %.1fs): continuing, "
                 "a restart resumes from the last committed checkpoint", remaining, last_save_s)
    return short


def move_or_wait(deadline: float, step: int, agree: Callable, rank: int, capacity_elsewhere: Callable[[], bool],
                 telemetry, move_on: bool = True) -> bool:
    """After the notice's checkpoint committed: True as soon as the worker group fits on other nodes (``move_on``),
    else False once the node should have gone (it did not: training goes on)."""
    waiting_since, asking = time.monotonic(), move_on
    while time.time() < deadline + PREEMPTION_WAIT_GRACE_S:
        # Rank 0 asks and every rank follows, until shortly before the deadline: a peer dying inside a collective
        # would fail the survivors with an error that is not the preemption's.
        move = False
        if asking:
            asking = time.time() < deadline - 3 * MOVE_ON_POLL_S
            asking, move = agree((asking, asking and rank == 0 and capacity_elsewhere()))
        if move:
            telemetry.drain_wait(time.monotonic() - waiting_since)
            telemetry.moved(time.time())
            if rank == 0:
                log.info("preemption notice: the worker group fits on other nodes: restarting there from "
                         "step %d without waiting for the node to go", step)
            return True
        time.sleep(MOVE_ON_POLL_S)
    telemetry.drain_wait(time.monotonic() - waiting_since)
    log.warning("the announced preemption did not happen: continuing to train")
    return False


class GrowBack:
    """Whether a run below ``scaling.num_workers`` grows back now. Rank 0 looks at the cluster (``fits``: the whole
    group would fit) when asked, at committed steps; the run grows once it has seen room at every look for
    ``after_s`` (``scaling.grow_after_s``). A node that comes and goes within that never ends an attempt, and a run
    only ever shrinks after a loss: the size cannot flap. A collective: every rank asks alike and follows rank 0
    (``agree``: see ``rank0_decides``)."""

    def __init__(self, fits: Callable[[], bool], agree: Callable, rank: int, after_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.fits, self.agree, self.rank, self.after_s, self.clock = fits, agree, rank, after_s, clock
        self.fits_since: float | None = None

    def due(self) -> bool:
        ready = False
        if self.rank == 0:
            now = self.clock()
            self.fits_since = (self.fits_since if self.fits_since is not None else now) if self.fits() else None
            ready = self.fits_since is not None and now - self.fits_since >= self.after_s
        return bool(self.agree(ready))


def rank0_decides(flag: bool, device: torch.device) -> bool:
    """Rank 0's ``flag`` on every rank (the others pass False), over the training group: a save in flight runs its
    collectives on the checkpoints' group in the background, and one asked there meanwhile could pair with them."""
    return slowest_rank((float(flag),), device)[0] > 0


def slowest_rank(values: tuple[float, ...], device: torch.device) -> list[float]:
    """Each value's maximum over the ranks, so that every rank computes the same interval."""
    import torch  # here, not above: `spotray estimate` reads the interval rule (interval_steps) without torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()
