"""``spotray status``: where a run stands, read from its storage alone, from any machine that can reach it.

Read-only and light, so that it can be run against a run while it trains, as often as one likes: it reads the
ledger's small records (losses, evaluations, the newest attempt's log intervals) and the checkpoints' commit markers,
never a checkpoint's data; it writes and locks nothing.
"""

from __future__ import annotations

import time
from urllib.parse import urlparse

from spotray.accounts import cost, endings, goodput, ledger
from spotray.checkpoints.dcp import (
    FILES_FORMAT,
    CommittedCheckpoint,
    best_checkpoint,
    checkpoints_root,
    list_committed,
    list_set_aside,
)
from spotray.errors import StorageError, Unreachable
from spotray.formats import step_count
from spotray.storage import Location, StorageOptions, resolve
from spotray.worker import memory

# Rank 0 rewrites its status.json every train.log_every steps (10 by default). A blocking checkpoint save or a
# drain (a spot notice's 2 minutes, plus a grace) can hold the next write back for minutes without the run stopping.
LIVE_WITHIN_S = 180.0
LIVE_WITHIN_STEPS = 30  # three log intervals at the default cadence: for runs whose steps are slow
READ_TRIES = 3
RETRY_PAUSE_S = 0.5
RUN_URL_HINT = "give a run's URL, <checkpoint.path>/<run.name> (a local dir, file:///abs/path or s3://bucket/prefix)"
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
SHOWN_EVALS = 5  # the text shows the last few evaluations (the JSON has them all)


def gather(run_url: str, options: StorageOptions | None = None) -> dict:
    """The run's status as one JSON-ready dict, with the same keys whatever state the run is in."""
    root = _run_root(run_url, options)
    failures = 0
    while True:
        try:
            return _snapshot(root, time.time())
        # Records are replaced whole, yet one can vanish between a listing and its read (retention deletes old
        # checkpoints) or be caught half-written on a store without atomic replace: read the run again.
        except (StorageError, ValueError, KeyError, TypeError) as exc:
            failures += 1
            if failures == READ_TRIES:
                raise StorageError(f"cannot read the records of the run at {root.url} ({_first_line(exc)}); "
                                   "run the command again") from exc
            time.sleep(RETRY_PAUSE_S)


def _run_root(run_url: str, options: StorageOptions | None) -> Location:
    root = resolve(run_url, options)
    try:
        is_run = ledger.attempts_root(root).is_dir() or checkpoints_root(root).is_dir()
    except Unreachable:
        raise  # the store is the thing to correct, not the run's URL
    except StorageError as exc:
        raise StorageError(f"cannot read {root.url} ({_first_line(exc)}): {RUN_URL_HINT}") from exc
    if not is_run and root.bucket_missing():
        raise StorageError(f"{root.url} is not a training run: bucket '{urlparse(root.url).netloc}' does not exist; "
                           "check the bucket name and --endpoint-url")
    if not is_run:
        raise StorageError(f"{root.url} is not a training run (it has no attempts/ or checkpoints/): {RUN_URL_HINT}")
    return root


def _snapshot(root: Location, now: float) -> dict:
    attempts_root = ledger.attempts_root(root)
    records = goodput.attempt_records(attempts_root)
    account = goodput.account_of(records, ledger.run_started_at(attempts_root))
    time_split = account.to_dict()
    committed = list_committed(checkpoints_root(root), warn=False)
    evals = _lineage_evals(attempts_root, records)
    return {
        "run": root.url,
        **_latest(records, account, now),
        "val_loss": next((e["val_loss"] for e in reversed(evals) if e["val_loss"] is not None), None),
        "evals": [{"step": e["step"], "metrics": e["metrics"]} for e in evals],
        "best": _best(committed),
        "best_eval": _best_eval(evals),
        "memory": _memory(attempts_root, records),
        "checkpoints": [_checkpoint(c, now) for c in committed],
        "snapshot": _newest_snapshot(attempts_root, records),
        "workers": _workers(records[-1].info) if records else None,
        "set_aside": [_set_aside(r) for r in list_set_aside(root)],
        "attempts": [_attempt(r) for r in records],
        "endings": time_split["events"],
        "spot_interruptions": time_split["interruptions"],
        "endings_unrecorded": _endings_unrecorded(attempts_root, account),
        "lost_steps": time_split["lost_steps"],
        "lost_steps_at_most": time_split["lost_steps_at_most"],
        "goodput": time_split["goodput"],
        "total_s": time_split["total_s"],
        "paused_s": time_split["paused_s"],
        "badput_s": {k: v for k, v in time_split["seconds"].items() if k != "productive"},
        "cost": cost.ledger_cost(attempts_root, records, account).to_dict(),
    }


def _latest(records: list[goodput.AttemptRecord], account: goodput.Account, now: float) -> dict:
    """The newest attempt: whether it trains, how far it got, and when it was last heard of."""
    if not records:
        return {"state": "stopped", "step": 0, "max_steps": None, "last_loss": None, "last_loss_step": None,
                "tokens_per_s": None, "last_seen_s_ago": None, "error": None}
    latest = records[-1]
    # A script logs its loss every few steps (the Trainer's logging_steps): the last loss of the history.
    loss_step = max((step for step, record in account.kept.items()
                     if record.loss is not None and step <= latest.last_step), default=None)
    return {"state": _state(latest, now), "step": latest.last_step,
            "max_steps": next((r.status["max_steps"] for r in reversed(records) if r.status), None),
            "last_loss": None if loss_step is None else account.kept[loss_step].loss, "last_loss_step": loss_step,
            "tokens_per_s": latest.status_of("tokens_per_s", None),
            "last_seen_s_ago": round(now - latest.last_seen, 1), "error": latest.status_of("error", None)}


def _state(latest: goodput.AttemptRecord, now: float) -> str:
    ending = latest.ending
    if ending.kind == endings.FINISHED:
        return "finished"
    if ending.kind != endings.UNKNOWN or now - latest.last_seen > _live_window_s(latest):
        return "stopped"
    return "live"


def _endings_unrecorded(attempts_root: Location, account: goodput.Account) -> bool:
    """Endings read as unknown because the ledger predates their records (no driver ever recorded itself)."""
    return (any(e.kind == endings.UNKNOWN for e in account.events)
            and not attempts_root.child(endings.DRIVER_FILE).exists())


def _live_window_s(latest: goodput.AttemptRecord) -> float:
    """How long rank 0 may stay silent and still be training, scaled to the attempt's own pace."""
    first_step_at = latest.status_of("first_step_at", None)
    steps = latest.last_step - latest.info.from_step
    seconds_per_step = (latest.last_seen - first_step_at) / steps if first_step_at and steps > 0 else 0.0
    return max(LIVE_WITHIN_S, LIVE_WITHIN_STEPS * seconds_per_step)


def _lineage_evals(attempts_root: Location, records: list[goodput.AttemptRecord]) -> list[dict]:
    """The final model's evaluations, oldest first, as ``ledger.lineage_evals`` without listing the attempts again:
    each ``{"step", "metrics", "val_loss"}`` (None where an evaluation has no val loss)."""
    evals: dict[int, dict] = {}
    for record in records:
        evals = ledger.continue_lineage(evals, record.info.from_step,
                                        ledger.read_evals(attempts_root, record.info.attempt_id))
    return [{"step": step, "metrics": dict(e.get("metrics") or {}), "val_loss": _val_loss(e.get("metrics"))}
            for step, e in evals.items()]


def _val_loss(metrics: dict | None) -> float | None:
    value = (metrics or {}).get("val_loss")
    return None if value is None else float(value)


def _best(committed: list[CommittedCheckpoint]) -> dict | None:
    """The committed checkpoint with the lowest val loss (the one ``checkpoint.keep_best`` keeps)."""
    best = best_checkpoint(committed)
    return None if best is None else {"step": best.step, "val_loss": best.val_loss, "url": best.url}


def _best_eval(evals: list[dict]) -> dict | None:
    """The lowest val loss evaluated in the final model's history (the older step of a tie), checkpointed or not."""
    evaluated = [e for e in evals if e["val_loss"] is not None]
    if not evaluated:
        return None
    best = min(evaluated, key=lambda e: (e["val_loss"], e["step"]))
    return {"step": best["step"], "val_loss": best["val_loss"]}


def _memory(attempts_root: Location, records: list[goodput.AttemptRecord]) -> dict | None:
    """Each kind's largest figure and its rank (``memory.highest``, as the run summary has it over the whole run)
    at the newest attempt's last log interval; None before that attempt logged one. A finished run's newest attempt
    may have trained no step (a rerun of the finished run): then the newest attempt's before it that logged one."""
    for record in reversed(records):
        intervals = ledger.read_intervals(attempts_root, record.info.attempt_id)
        if intervals:
            last = intervals[max(intervals)].get("memory")
            return memory.highest([last]) if last else None
        if not (record.finished and record.last_step == record.info.from_step):
            return None
    return None


def _checkpoint(checkpoint: CommittedCheckpoint, now: float) -> dict:
    return {"step": checkpoint.step, "bytes": checkpoint.nbytes, "age_s": round(now - checkpoint.committed_at, 1),
            "world_size": checkpoint.world_size, "url": checkpoint.url, "val_loss": checkpoint.val_loss,
            "format": checkpoint.format}


def _workers(newest: ledger.AttemptInfo) -> dict:
    return {"now": newest.world_size, "configured": newest.configured_workers or newest.world_size}


def _workers_text(workers: dict) -> str:
    text = f"{workers['now']} of {workers['configured']}"
    if workers["now"] < workers["configured"]:
        text += " (shrunk after a lost node: it grows back when capacity returns)"
    return text


def _set_aside(record: dict) -> dict:
    return {key: record[key] for key in ("step", "url", "reason", "resumed_from")}


def _attempt(record: goodput.AttemptRecord) -> dict:
    return {"id": record.info.attempt_id, "from_step": record.info.from_step, "last_step": record.last_step,
            "world_size": record.info.world_size, "ending": record.ending.kind, "reason": record.ending.reason}


def format_text(status: dict) -> str:
    """A few lines for a terminal."""
    events = status["endings"]
    return "\n".join([
        f"run          {status['run']}",
        f"state        {_state_text(status)}",
        f"progress     {_progress_text(status)}",
        f"val loss     {_val_loss_text(status)}",
        *([f"workers      {_workers_text(status['workers'])}"] if status["workers"] else []),
        f"memory       {_memory_text(status['memory'])}",
        f"checkpoints  {_checkpoints_text(status['checkpoints'])}",
        *([f"snapshots    {_snapshot_text(status['snapshot'])}"] if status["snapshot"] else []),
        *(f"set aside    step {r['step']} in {r['url']} (unreadable: {r['reason']}; the run went on from step "
          f"{r['resumed_from']})" for r in status["set_aside"]),
        f"attempts     {len(status['attempts'])}, {status['spot_interruptions']} spot interruptions, "
        f"{step_count(status['lost_steps'])} lost{_at_most(status)}",
        *(f"  {_ending_text(e)}" for e in events),
        *(["  (this run's ledger predates recorded endings: its attempts' endings read as unknown)"]
          if status["endings_unrecorded"] else []),
        f"goodput      {_goodput_text(status)}",
        f"cost         {cost.money_text(status['cost'])}",
        f"spot         {cost.rate_text(status['cost'])}",
    ])


def _state_text(status: dict) -> str:
    if status["last_seen_s_ago"] is None:
        return f"{status['state']} (no attempt has started)"
    text = f"{status['state']} (last seen {status['last_seen_s_ago']:,.0f}s ago)"
    if status["error"]:
        return f"{text}: {status['error']}"
    if status["state"] == "stopped":
        return f"{text}: interrupted, or waiting for a restart"
    return text


def _progress_text(status: dict) -> str:
    parts = [f"step {status['step']}" + (f"/{status['max_steps']}" if status["max_steps"] else "")]
    if status["last_loss"] is not None:
        at = "" if status["last_loss_step"] == status["step"] else f" (logged at step {status['last_loss_step']})"
        parts.append(f"loss {status['last_loss']:.4f}{at}")
    if status["tokens_per_s"]:
        parts.append(f"{status['tokens_per_s']:,.0f} tok/s")
    return ", ".join(parts)


def _val_loss_text(status: dict) -> str:
    evaluated = [(e["step"], _val_loss(e["metrics"])) for e in status["evals"]]
    evaluated = [(step, value) for step, value in evaluated if value is not None]
    if not evaluated:
        return "none evaluated (evaluation is off, or none has run yet)"
    shown = evaluated[-SHOWN_EVALS:]
    text = ", ".join(f"step {step} {value:.4f}" for step, value in shown)
    if len(evaluated) > len(shown):
        text = f"{text} (the last {len(shown)} of {len(evaluated)})"
    kept = {c["step"] for c in status["checkpoints"]}
    best, lowest = status["best"], status["best_eval"]
    parts = [text]
    if best is not None:
        parts.append(f"best step {best['step']} {best['val_loss']:.4f} (checkpoint kept)")
    if lowest is not None and (best is None or lowest["step"] != best["step"]):
        label = "best" if best is None else "lowest evaluated"
        where = "checkpoint kept" if lowest["step"] in kept else "no checkpoint kept"
        parts.append(f"{label} step {lowest['step']} {lowest['val_loss']:.4f} ({where})")
    return "; ".join(parts)


def _memory_text(figures: dict | None) -> str:
    if figures is None:
        return "not recorded yet (no log interval of the newest attempt)"

    def part(label: str, kind: str) -> str | None:
        top = figures.get(kind)
        return None if top is None else f"{label} {_size(top['max'])} (rank {top['rank']})"

    host = [p for p in (part("host RSS", "rss_bytes"), part("peak", "peak_rss_bytes")) if p]
    cuda = [p for p in (part("CUDA allocated peak", "cuda_allocated_peak_bytes"),
                        part("reserved peak", "cuda_reserved_peak_bytes")) if p]
    return "; ".join(", ".join(group) for group in (host, cuda) if group) or "none measured"


def _checkpoints_text(checkpoints: list[dict]) -> str:
    if not checkpoints:
        return "none committed"
    return ", ".join(f"step {c['step']} ({_size(c['bytes'])}{', script files' if c['format'] == FILES_FORMAT else ''}, "
                     f"{c['age_s']:,.0f}s ago)" for c in checkpoints)


def _newest_snapshot(attempts_root: Location, records: list[goodput.AttemptRecord]) -> dict | None:
    """The newest attempt's newest in-memory snapshot, what its nodes hold, and whether they may still hold it."""
    snapshot = records[-1].status_of("snapshot", None) if records else None
    return None if snapshot is None else {**snapshot, "held": not endings.driver_has_ended(attempts_root)}


def _snapshot_text(snapshot: dict) -> str:
    nodes = snapshot["nodes"].values()
    most, count = _size(max(n["bytes"] for n in nodes)), f"{len(nodes)} node{'s' * (len(nodes) != 1)}"
    if not snapshot["held"]:
        return f"step {snapshot['step']}, released when the run's driver ended (up to {most} held on one of {count})"
    return (f"step {snapshot['step']} in memory on {count}, up to {most} on one (each may hold "
            f"{_size(min(n['cap'] for n in nodes))})")


def _ending_text(event: dict) -> str:
    if event["kind"] in endings.PAUSES:
        resumed = f"continued from step {event['resumed_from']} by a rerun"
    else:
        resumed = ("not resumed yet" if event["recovery_s"] is None else
                   f"resumed from {goodput.resumed_point(event['resumed_from'], event['from_snapshot'])} after "
                   f"{event['recovery_s']:.1f}s")
    spot = "spot interruption, " if event["spot"] else ""
    return (f"{event['kind']} at step {event['step']} ({spot}{event['reason']}): {step_count(event['lost_steps'])} lost"
            f"{_at_most(event)}, {resumed}")


def _at_most(counted: dict) -> str:
    exact = counted["lost_steps_at_most"] == counted["lost_steps"]
    return "" if exact else f" (at most {counted['lost_steps_at_most']})"


def _goodput_text(status: dict) -> str:
    badput = ", ".join(f"{category} {seconds:,.0f}s" for category, seconds in status["badput_s"].items()
                       if seconds or category not in goodput.USED_ONLY_CATEGORIES)
    paused = (f"; paused {status['paused_s']:,.0f}s between a stop or a finish and a rerun (not counted)"
              if status["paused_s"] else "")
    return f"{100 * status['goodput']:.1f}% of {status['total_s']:,.0f}s; badput: {badput}{paused}"


def _size(nbytes: int) -> str:
    power = min(len(_UNITS) - 1, max(0, nbytes.bit_length() - 1) // 10)
    return f"{nbytes / 1024**power:.1f} {_UNITS[power]}" if power else f"{nbytes} B"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
