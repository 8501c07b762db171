"""When an attempt checkpoints, when it asks about preemptions, and what it does on a notice: one core for
spotray's own loop and for a user's script (``spotray.should_save`` / ``commit`` / ``should_stop``).

Every decision here is a collective taken alike on every rank: rank 0's view (or the slowest rank's timing) wins."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from spotray.config import TrainConfig
from spotray.interval import CheckpointInterval, PreemptionChecks

log = logging.getLogger(__name__)

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


def slowest_rank(values: tuple[float, ...], device: torch.device) -> list[float]:
    """Each value's maximum over the ranks, so that every rank computes the same interval."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()
