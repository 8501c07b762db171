"""How often to checkpoint, and how often to ask Ray about preemptions.

``checkpoint.every_steps`` is a fixed count, or ``auto``: the Young–Daly interval from the saves this attempt has
timed and ``fault_tolerance.expected_interruptions_per_hour``, re-evaluated after every save and logged when it
changes. A preemption notice triggers its emergency checkpoint whatever the interval.
``fault_tolerance.preemption_check_every_steps`` is a fixed count, or ``auto``: about every ``CHECK_EVERY_S``."""

from __future__ import annotations

import logging
import math

from spotray.config import AUTO

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
