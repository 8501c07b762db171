"""What the trackers get, read from the run's ledger: one row of metrics per step of the final model's history
(``ledger.lineage`` and its log intervals and evaluations), the interruptions, the config and the summary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from spotray.accounts import endings, goodput, ledger
from spotray.storage import Location


@dataclass(frozen=True)
class Row:
    step: int
    metrics: dict[str, float]
    time: float  # UNIX time the row was first sent: a resent row is the same point

    @property
    def points(self) -> int:
        return len(self.metrics)


def step_metrics(record: ledger.StepRecord) -> dict[str, float]:
    named = {"train/loss": record.loss, "train/lr": record.lr, "train/grad_norm": record.grad_norm}
    return {name: value for name, value in named.items() if value is not None}


def interval_metrics(interval: dict) -> dict[str, float]:
    named = {"train/tokens_per_s": interval.get("tokens_per_s"), "train/mfu": interval.get("mfu"),
             "goodput": interval.get("goodput"), "cost/usd": interval.get("cost_usd"),
             "cost/usd_per_million_tokens": interval.get("usd_per_million_tokens"),
             "cost/on_demand_usd": interval.get("on_demand_usd"), "cost/spot_saving": interval.get("spot_saving_ratio")}
    for kind, per_rank in (interval.get("memory") or {}).items():
        named.update({f"memory/rank{rank}/{kind}": value for rank, value in enumerate(per_rank or ())})
    return {name: value for name, value in named.items() if value is not None}


def eval_metrics(evaluation: dict) -> dict[str, float]:
    """``val_loss`` is ``val/loss``; a task's own metric ``name`` is ``val/name``."""
    return {f"val/{name.removeprefix('val_')}": value for name, value in evaluation["metrics"].items()}


def flat_params(config: dict, prefix: str = "") -> dict[str, str]:
    """``cfg.to_dict()`` as ``{"train.lr": "0.001", ...}``."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flat_params(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat


def summary_scalars(summary: dict) -> dict[str, float | int | str | bool]:
    """The summary's scalars, and its known cost figures as ``cost_<name>``."""
    bill = summary.get("cost") or {}
    costs = {f"cost_{key}": bill.get(key) for key in ("usd", "usd_per_million_tokens", "on_demand_usd", "saving")}
    return {key: value for key, value in {**summary, **costs}.items() if isinstance(value, float | int | str | bool)}


@dataclass(frozen=True)
class Snapshot:
    """The ledger as one poll read it. Rows up to ``horizon`` are settled: every record of those steps is written."""

    steps: dict[int, ledger.StepRecord]
    intervals: dict[int, dict]
    evals: dict[int, dict]
    horizon: int
    events: list[goodput.Event]  # attempts' endings, each once its kind is on record or the next attempt trained

    def rows_after(self, step: int, first_sent: Callable[[int], float]) -> list[Row]:
        wanted = sorted(s for s in {*self.steps, *self.intervals, *self.evals} if step < s <= self.horizon)
        return [Row(s, self._metrics(s), first_sent(s)) for s in wanted]

    def _metrics(self, step: int) -> dict[str, float]:
        metrics = step_metrics(self.steps[step]) if step in self.steps else {}
        if step in self.intervals:
            metrics.update(interval_metrics(self.intervals[step]))
        if step in self.evals:
            metrics.update(eval_metrics(self.evals[step]))
        return metrics


@dataclass(frozen=True)
class _Attempt:
    info: ledger.AttemptInfo
    status: dict | None
    steps: dict[int, ledger.StepRecord]
    intervals: dict[int, dict]
    evals: dict[int, dict]
    finished: bool
    recorded: dict | None  # the driver's ending.json

    def record(self) -> goodput.AttemptRecord:
        return goodput.AttemptRecord(self.info, self.status, self.steps, self.finished, self.recorded)


class LedgerFeed:
    """Reads the run's ledger poll after poll; an attempt that a newer one followed is read once more, then kept,
    but for its ending, which the driver may record later (a node's loss reaches Ray seconds after the restart)."""

    def __init__(self, attempts_root: Location, log_every: int):
        self.root, self.log_every = attempts_root, log_every
        self._known: dict[str, ledger.AttemptInfo] = {}
        self._ended: dict[str, _Attempt] = {}

    def snapshot(self, final: bool) -> Snapshot:
        """``final``: the run's workers are gone, so every record is written."""
        infos = ledger.read_attempts(self.root, self._known)
        attempts = [self._ended_attempt(info.attempt_id) or self._read(info) for info in infos]
        for attempt in attempts[:-1]:
            self._ended.setdefault(attempt.info.attempt_id, attempt)
        steps: dict = {}
        intervals: dict = {}
        evals: dict = {}
        for a in attempts:
            steps = ledger.continue_lineage(steps, a.info.from_step, a.steps)
            intervals = ledger.continue_lineage(intervals, a.info.from_step, a.intervals)
            evals = ledger.continue_lineage(evals, a.info.from_step, a.evals)
        horizon = max([*steps, *intervals, *evals], default=0) if final or not attempts else self._horizon(attempts[-1])
        events = [goodput.interruption(prev.record(), cur.record()) for prev, cur in zip(attempts, attempts[1:],
                                                                                          strict=False)]
        if events and not final and not _settled(events[-1], attempts[-1]):
            events.pop()  # its ending or its recovery time is still to come
        return Snapshot(steps, intervals, evals, horizon, events)

    def _ended_attempt(self, attempt_id: str) -> _Attempt | None:
        attempt = self._ended.get(attempt_id)
        if attempt is not None and attempt.recorded is None and not attempt.finished:
            attempt = self._ended[attempt_id] = replace(attempt, recorded=endings.read(self.root, attempt_id))
        return attempt

    def _horizon(self, newest: _Attempt) -> int:
        """Rank 0 writes each kind of record on its own, about once a log interval: a live attempt's steps are
        settled one log interval behind its newest step record."""
        return max(newest.info.from_step, max(newest.steps, default=0) - self.log_every)

    def _read(self, info: ledger.AttemptInfo) -> _Attempt:
        attempt_id = info.attempt_id
        return _Attempt(info, goodput.read_status(self.root, attempt_id), ledger.read_steps(self.root, attempt_id),
                        ledger.read_intervals(self.root, attempt_id), ledger.read_evals(self.root, attempt_id),
                        ledger.attempt_finished(self.root, attempt_id), endings.read(self.root, attempt_id))


def _settled(event: goodput.Event, newest: _Attempt) -> bool:
    """An ending is sent once: a stop or a finish at once, any other once the next attempt trained (its recovery is
    known then, and a lost node on record)."""
    return event.kind in endings.PAUSES or bool((newest.status or {}).get("first_step_at"))
