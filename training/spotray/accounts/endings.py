"""Why each attempt ended, from evidence, never by elimination.

Who records what:
- rank 0 of the attempt: a preemption notice, an error and an end to grow back (its ``status.json``), a finish
  (its ``final.json``);
- the driver (``ending.json`` of the attempt): a node the attempt held that Ray or Kubernetes reports lost, with the
  reason given there; the user's stop (Ctrl-C, SIGTERM of the driver); the loss of the head; its own failure; its
  start of the workers again where Ray Train failed to replace lost ones (a node loss reported later replaces it);
- the next driver: a driver that started and never recorded its end was lost (with the head it ran on, or alone).

Only ``SPOT`` endings are spot interruptions: they alone count for AWS's free first hour, for the observed
interruption rate and for every interruption figure. An attempt with no evidence reads as ``unknown``, which counts
as none of them; a ledger written before endings were recorded has no evidence for any attempt.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from spotray.storage import Location

ENDING_FILE = "ending.json"
DRIVER_FILE = "driver.json"

NOTICE = "notice"  # a spot preemption notice: the workers drained
KILL = "kill"  # a spot node the attempt held was lost without notice
NODE_LOST = "node_lost"  # a node that is not (known to be) spot was lost
ERROR = "error"  # the training raised
FINISHED = "finished"  # trained to its end; a rerun with more steps continues it
STOPPED = "stopped"  # the user stopped the driver
HEAD_LOST = "head_lost"  # the Ray head stopped answering the driver
DRIVER_FAILED = "driver_failed"  # the driver itself failed
DRIVER_LOST = "driver_lost"  # the driver ended without a record of why: it, or the head it ran on, was lost
RESIZE = "resize"  # ended at a committed step to restart with the whole worker group, once capacity was back
RESTARTED = "restarted"  # the driver started the workers again: Ray Train failed to replace lost ones
UNKNOWN = "unknown"

SPOT = frozenset({NOTICE, KILL})
NODE_LOSSES = frozenset({KILL, NODE_LOST})
UNCHARGED = frozenset({RESIZE, RESTARTED})  # no failure: a restart the run chose, or one a node loss already charged
PAUSES = frozenset({FINISHED, STOPPED})  # the run did not exist until someone ran it again: not its time
DESCRIPTIONS = {NOTICE: "spot preemption notice", KILL: "spot node lost without notice", NODE_LOST: "node lost",
                ERROR: "error", FINISHED: "finished", STOPPED: "stopped by the user", HEAD_LOST: "Ray head lost",
                DRIVER_FAILED: "driver failed", DRIVER_LOST: "driver or head lost (no record of why)",
                RESIZE: "ended to grow back to the whole worker group",
                RESTARTED: "started again after Ray Train failed to replace lost workers",
                UNKNOWN: "unknown (no record of why)"}
SPOT_DEATHS = frozenset({"AUTOSCALER_DRAIN_PREEMPTED"})  # Ray's node death reasons that name a spot preemption


@dataclass(frozen=True)
class Ending:
    kind: str
    reason: str  # the evidence, in words

    @property
    def spot(self) -> bool:
        return self.kind in SPOT

    @property
    def pause(self) -> bool:
        return self.kind in PAUSES


def of_attempt(status: dict | None, finished: bool, recorded: dict | None) -> Ending:
    """An attempt's ending from its records: rank 0's own first, then what a driver recorded."""
    status = status or {}
    if status.get("notice"):
        return Ending(NOTICE, f"notice at step {status['notice']['step']}")
    if status.get("error"):
        return Ending(ERROR, str(status["error"])[:200])
    if status.get("grew"):
        return Ending(RESIZE, f"capacity for the whole worker group was back at step {status['grew']['step']}")
    if finished:
        return Ending(FINISHED, "trained to its last step")
    if recorded:
        return Ending(recorded["kind"], recorded["reason"])
    return Ending(UNKNOWN, DESCRIPTIONS[UNKNOWN])


def node_loss(capacity_type: str | None, reason: str) -> str:
    """The ending of an attempt that lost a node: a spot interruption only where the node was spot."""
    return KILL if capacity_type == "spot" or reason in SPOT_DEATHS else NODE_LOST


def read(root: Location, attempt_id: str) -> dict | None:
    text = root.child(attempt_id, ENDING_FILE).read_text_if_exists()
    return json.loads(text) if text is not None else None


def record(root: Location, attempt_id: str, kind: str, reason: str) -> None:
    """The driver's evidence for an attempt; the first record wins (the node loss that ended it comes first), but a
    node loss replaces a start again: where Ray Train fails before Ray says a node is dead, the newest attempt may be
    the one that lost it."""
    location = root.child(attempt_id, ENDING_FILE)
    text = location.read_text_if_exists()
    if text is None or (kind in NODE_LOSSES and json.loads(text)["kind"] == RESTARTED):
        location.write_text(json.dumps({"kind": kind, "reason": reason, "at": time.time()}, sort_keys=True))


def driver_started(root: Location, newest_attempt: str | None, holder: dict) -> dict:
    """This driver starts (``holder``: its process, ``spotray.driver.lease``): a previous driver that never recorded
    its end was lost, and so was its last attempt. Returns the record written."""
    previous = driver_record(root)
    if previous is not None and not previous.get("ended") and newest_attempt:
        record(root, newest_attempt, DRIVER_LOST, "the driver that ran it ended without recording why")
    started = {"started_at": time.time(), "ended": False, **holder}
    driver_renewed(root, started)
    return started


def driver_renewed(root: Location, started: dict) -> None:
    root.child(DRIVER_FILE).write_text(json.dumps(started))


def driver_record(root: Location) -> dict | None:
    text = root.child(DRIVER_FILE).read_text_if_exists()
    return None if text is None else json.loads(text)


def driver_has_ended(root: Location) -> bool:
    """Whether the run's newest driver recorded its end: it let the run's snapshot holders go then."""
    written = driver_record(root)
    return written is not None and bool(written.get("ended"))


def driver_ended(root: Location, newest_attempt: str | None, kind: str | None, reason: str) -> None:
    """This driver ends; ``kind``: how its last attempt ended, where only the driver knows (None: the attempt's own
    records say it, as for a finish, an error or a notice)."""
    if kind is not None and newest_attempt:
        record(root, newest_attempt, kind, reason)
    root.child(DRIVER_FILE).write_text(json.dumps({"ended": True, "ended_at": time.time(), "kind": kind}))
