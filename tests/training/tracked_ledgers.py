"""Run ledgers with every record the trackers get (steps with learning rate and gradient norm, log intervals with
memory, evaluations), written directly. Each value is a function of the step alone, as an exact resume trains it."""

from __future__ import annotations

import json
import math

from spotray.accounts import endings, goodput, ledger
from spotray.storage import Location

LOG_EVERY, EVAL_EVERY = 5, 10
RANKS = 2


def loss(step: int) -> float:
    return 10.0 / step


def lr(step: int) -> float:
    return 1e-3 * min(1.0, step / 10)


def grad_norm(step: int) -> float:
    return 1.0 + 1.0 / step


def interval(step: int) -> dict:
    return {"tokens_per_s": 1000.0 + step, "mfu": None, "goodput": 0.5, "step_s": 0.1,
            "memory": {"rss_bytes": [100 * step + r for r in range(RANKS)],
                       "peak_rss_bytes": [200 * step + r for r in range(RANKS)],
                       "cuda_allocated_peak_bytes": None, "cuda_reserved_peak_bytes": None}}


def evaluation(step: int) -> dict:
    return {"val_loss": 5.0 / step, "val_perplexity": math.exp(5.0 / step), "accuracy": step / 100}


KILLED = "node n1 (spot) lost: Ray says UNEXPECTED_TERMINATION"  # the driver's record of a kill


def write_attempt(root: Location, attempt_id: str, from_step: int, last_step: int, started_at: float,
                  notice_at: float | None = None, killed: bool = False) -> None:
    """Attempt ``attempt_id`` trained steps ``from_step+1 .. last_step``, from ``started_at`` on (one second a step),
    with a log interval every LOG_EVERY steps and an evaluation every EVAL_EVERY; ``notice_at``: it ended on a
    preemption notice at its last step, whose emergency checkpoint committed; ``killed``: the driver saw its spot node
    lost (``KILLED``)."""
    ledger.write_attempt(root, ledger.AttemptInfo(attempt_id, from_step, world_size=RANKS, per_rank_batch=4,
                                                  started_at=started_at))
    writer = ledger.RecordWriter()
    losses = ledger.LossLog(root, attempt_id, writer)
    intervals, evals = ledger.interval_log(root, attempt_id, writer), ledger.eval_log(root, attempt_id, writer)
    for step in range(from_step + 1, last_step + 1):
        losses.record(step, loss(step), 1.0, lr(step), grad_norm(step))
        if step % LOG_EVERY == 0:
            intervals.record(step, **interval(step))
        if step % EVAL_EVERY == 0:
            evals.record(step, metrics=evaluation(step), s=0.5)
    losses.flush()
    trained = last_step - from_step
    notice = {"step": last_step, "at": notice_at, "committed": True} if notice_at else None
    clock = goodput.AttemptClock(root, attempt_id, started_at, 100, writer, LOG_EVERY)
    clock.update(first_step_at=started_at + 2 if trained else None, last_seen=started_at + 2 + trained,
                 step=last_step, notice=notice)
    writer.put(clock.location, json.dumps(clock.status))  # flush() would stamp last_seen with now
    writer.close(timeout_s=10)
    if killed:
        endings.record(root, attempt_id, endings.KILL, KILLED)


def expected_series(root: Location) -> dict[str, dict[int, float]]:
    """What a tracker should hold of the run under ``root``: name -> {step: value}, from the ledger itself."""
    wanted: dict[str, dict[int, float]] = {}
    for step, record in ledger.lineage(root).items():
        named = {"train/loss": record.loss, "train/lr": record.lr, "train/grad_norm": record.grad_norm}
        for name, value in named.items():
            if value is not None:
                wanted.setdefault(name, {})[step] = value
    for step, interval in ledger.lineage_intervals(root).items():
        wanted.setdefault("train/tokens_per_s", {})[step] = interval["tokens_per_s"]
        for rank, value in enumerate(interval["memory"]["rss_bytes"]):
            wanted.setdefault(f"memory/rank{rank}/rss_bytes", {})[step] = value
    for step, evaluation in ledger.lineage_evals(root).items():
        wanted.setdefault("val/loss", {})[step] = evaluation["metrics"]["val_loss"]
        wanted.setdefault("val/perplexity", {})[step] = evaluation["metrics"]["val_perplexity"]
        wanted.setdefault("val/accuracy", {})[step] = evaluation["metrics"]["accuracy"]
    return wanted
