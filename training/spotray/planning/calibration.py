"""``spotray estimate --from RUN_URL``: the planner's inputs as a real run's ledger measured them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from spotray.accounts import cost, goodput, ledger
from spotray.checkpoints.dcp import checkpoints_root, kept_interval, list_committed
from spotray.planning.planner import _fail
from spotray.storage import StorageOptions, resolve


@dataclass(frozen=True)
class Measured:
    """What a run's ledger says: ``values`` are ``Inputs`` fields, ``unknown`` the fields it cannot tell, with why
    and the flag to give instead. ``goodput`` and ``wall_s`` are the run's own, for comparison."""

    url: str
    values: dict[str, Any]
    unknown: dict[str, str] = field(default_factory=dict)
    goodput: float = 0.0
    wall_s: float = 0.0
    bill: cost.RunCost | None = None  # its node-hours and the interruption rate it saw (``cost``'s rules)


def inputs_from_run(url: str, options: StorageOptions | None = None, every_steps: int | None = None) -> Measured:
    """Step, save, restore and restart times, tokens per step, nodes and interruptions from a run's ledger
    (``goodput.account`` of its attempts). ``every_steps``: the run's ``checkpoint.every_steps``, which tells how
    many saves its blocked save time was spread over; without it, the gap between its kept checkpoints does.

    - step_s: the mean of the kept steps' own seconds; tokens_per_step: their mean tokens; steps: the last kept.
    - nodes: the distinct nodes the newest attempt's ranks ran on where its record names them, else its world size
      (a worker per node).
    - restore_s: the mean restore of the attempts that resumed; startup_s: the run's start to its first attempt's
      start-up end; restart_s: each interruption's recovery (to the first resumed step's end) less that attempt's
      restore and the step; notice_share: the interruptions whose notice committed a checkpoint.
    - blocking_save_s: all attempts' blocked save time over their saves (periodic, emergency and final); save_s
      the same (the ledger does not time an asynchronous save's whole: give --save-s).
    - overhead_s_per_step: evaluation and unclaimed ("other") time over the steps trained.
    - snapshot_s, where it took in-memory snapshots: their blocked time over their count (the planner then takes
      them every ``auto`` steps unless told)."""
    root = resolve(url, options)
    attempts_root = ledger.attempts_root(root)
    records = goodput.attempt_records(attempts_root)
    if not records:
        raise _fail("from", f"{url} has no attempts recorded", "give a run's URL, <checkpoint.path>/<run.name>")
    account = goodput.account_of(records, ledger.run_started_at(attempts_root))
    kept = account.kept
    if not kept:
        raise _fail("from", f"{url} has not trained a step yet", "give a run that has trained")
    values: dict[str, Any] = {"steps": max(kept), "step_s": statistics.fmean(r.seconds for r in kept.values())}
    unknown: dict[str, str] = {}
    tokens = [r.tokens for r in kept.values() if r.tokens]
    if tokens:
        values["tokens_per_step"] = statistics.fmean(tokens)
    else:
        unknown["tokens_per_step"] = "the run's steps record no tokens (a script's run): give --tokens-per-step"
    values["step_nodes"] = _attempt_nodes(records[-1])
    values["nodes"] = (values["step_nodes"],)
    resumed = [a for a in records if a.info.from_step > 0]
    if resumed:
        values["restore_s"] = statistics.fmean(a.status_of("restore_s") for a in resumed)
    first = records[0]
    values["startup_s"] = (first.entered_at - account.started_at + first.status_of("startup_s")
                           + first.status_of("compile_s"))
    recoveries = [_restart_s(prev, cur, values["step_s"]) for prev, cur in zip(records, records[1:], strict=False)]
    restarts = [r for r in recoveries if r is not None]
    if restarts:
        values["restart_s"] = statistics.fmean(restarts)
    else:
        unknown["restart_s"] = "the run was never interrupted: give --restart-s (capacity + start-up seconds)"
    events = account.interruptions  # spot ones only: a stop, an error or a lost driver is not the pool's rate
    values["interruptions"] = len(events)
    if events:
        values["notice_share"] = sum(1 for e in events if e.kind == "notice" and e.lost_steps == 0) / len(events)
    trained = sum(len(a.steps) for a in records)
    snapshots = sum(a.status_of("snapshots", 0) for a in records)
    if snapshots:
        values["snapshot_s"] = account.seconds["snapshot_save"] / snapshots
    values["overhead_s_per_step"] = (account.seconds["eval"] + account.seconds["other"]) / trained
    committed = list_committed(checkpoints_root(root), warn=False)  # newest first
    interval = every_steps or kept_interval([c.step for c in committed])
    if committed:
        values["checkpoint_bytes"] = float(committed[0].nbytes)
    if interval is None:
        unknown["blocking_save_s"] = ("cannot tell how many saves the run made (its kept checkpoints show no "
                                      "interval): give --every-steps (the run's checkpoint.every_steps) or "
                                      "--blocking-save-s")
    else:
        saves = sum(_saves(a, interval) for a in records)
        values["every_steps"] = interval
        values["blocking_save_s"] = values["save_s"] = account.seconds["checkpoint_save"] / max(1, saves)
    return Measured(root.url, values, unknown, account.goodput, account.total_s,
                    cost.ledger_cost(attempts_root, records, account))


def _restart_s(prev: goodput.AttemptRecord, cur: goodput.AttemptRecord, step_s: float) -> float | None:
    event = goodput.interruption(prev, cur)
    if event.recovery_s is None:
        return None
    first = cur.steps.get(cur.info.from_step + 1)
    return max(0.0, event.recovery_s - cur.status_of("restore_s") - (first.seconds if first else step_s))


def _saves(attempt: goodput.AttemptRecord, interval: int) -> int:
    """Saves one attempt made: at every multiple of ``interval`` it trained, its notice's emergency checkpoint (not a
    snapshot, which is memory), and the final commit where the last step is not a multiple."""
    last, start = attempt.last_step, attempt.info.from_step
    notice = attempt.status_of("notice", None)
    final = attempt.status_of("step", None) == attempt.status_of("max_steps", None) and last % interval != 0
    emergency = bool(notice and notice["committed"] and notice.get("kept_in", "checkpoint") == "checkpoint")
    return last // interval - start // interval + int(emergency) + int(bool(final))


def _attempt_nodes(attempt: goodput.AttemptRecord) -> int:
    """The distinct nodes the attempt's ranks ran on, where its record names every one; else its world size."""
    names = [n for n in getattr(attempt.info, "nodes", None) or [] if n and n != "unknown"]
    return len(set(names)) if names and len(names) == attempt.info.world_size else attempt.info.world_size


__all__ = ["Measured", "inputs_from_run"]
