"""A user's own training loop on spot: ``spotray.restore``, ``should_save``, ``commit``, ``report``, ``should_stop``,
and ``evaluating``.

One ``Session`` per worker of an attempt (``spotray train --script`` opens it). It keeps the attempt's ledger,
checkpoint cadence and notice handling with the same parts as spotray's own loop (``cadence.Cadence``,
``attempt.open_records``), and the script's files as checkpoints (``checkpoints.script_files``). Outside ``spotray train
--script`` (a script run as it is) every call does nothing, so the same script runs anywhere.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from spotray.accounts import ledger
from spotray.checkpoints.dcp import Checkpointer, list_committed
from spotray.checkpoints.script_files import FilesCheckpoints, FilesPrefetch
from spotray.config import TrainConfig
from spotray.errors import ConfigError, SpotrayError
from spotray.worker import memory
from spotray.worker.attempt import Records, WorkerEnv, open_records, run_root, shared_attempt_id
from spotray.worker.cadence import Cadence, move_or_wait, nominal_every_steps, too_short
from spotray.worker.compile_time import CompileTimer, set_apart
from spotray.worker.telemetry import RankZeroTelemetry, Telemetry

log = logging.getLogger(__name__)

LOCAL_DIR_ENV = "SPOTRAY_LOCAL_DIR"
STEP_METRICS = ("loss", "learning_rate", "lr", "grad_norm")  # what a step's record keeps of ``report``'s metrics


class MovedOn(BaseException):  # noqa: N818 - an outcome, not an error; BaseException: a script's `except Exception`
    """Raised into the script once a notice's checkpoint committed and the group moves to other capacity: the
    attempt ends there, and nothing the script does after training (saving, pushing) runs on a move."""


class FinishedAlready(BaseException):  # noqa: N818 - an outcome, not an error
    """Raised into a Trainer that resumed at or past its last step of a run its script finished there before: the
    Trainer would train one step more (it resumes mid-epoch without checking ``max_steps``). The attempt ends with
    the run's final record unchanged; the script's code after training ran when the run finished."""

    def __init__(self, final: dict):
        super().__init__(final["final_step"])
        self.final = final


def local_dir(cfg: TrainConfig) -> str:
    """This node's scratch directory for the run: ``script.local_dir``, ``$SPOTRAY_LOCAL_DIR``, or the temp dir."""
    base = cfg.script.local_dir or os.environ.get(LOCAL_DIR_ENV) or os.path.join(tempfile.gettempdir(), "spotray")
    return os.path.join(base, cfg.run.name)


class Session:
    def __init__(self, cfg: TrainConfig, env: WorkerEnv):
        self.cfg, self.env, self.entered_at = cfg, env, time.time()
        self.root = run_root(cfg)
        self.attempt_id = shared_attempt_id()
        self.checkpointer = Checkpointer(self.root, rank=env.rank, world_size=env.world_size,
                                         keep_last=cfg.checkpoint.keep_last, attempt_id=self.attempt_id)
        self.files = FilesCheckpoints(self.checkpointer, node_dir=Path(local_dir(cfg)))
        self.files.prefetch = FilesPrefetch.on_this_disk(self.checkpointer.root, Path(local_dir(cfg)))
        self.max_steps: int | None = None  # the steps the script trains, once it says (``plan``)
        self.records: Records | None = None
        self.from_step = 0
        self.steps: dict[int, dict] = {}  # step -> what was reported of it (seconds, loss, lr, grad norm)
        self.last_step = 0
        self.stop = False
        self._notice: tuple[int, float, float] | None = None  # (step, deadline, noticed at)
        self._warned: set[str] = set()
        self._last_report_at: float  # from _open on
        self._aside_s = 0.0  # since the last report: saving and evaluating, each its own category, not the next step
        self._save_asked_at: float | None = None  # when should_save last said yes: the script's save began
        self._compile_timer: CompileTimer | None = None  # from _open on, where the script may compile

    def plan(self, max_steps: int) -> None:
        """The steps the script will train (a Trainer knows them once it starts), for progress and the interval."""
        self.max_steps = max_steps
        if self.records is not None:
            self.cadence = self._cadence()
            self.telemetry.planned(max_steps)

    def restore(self, directory: str, max_steps: int | None = None) -> int | None:
        if max_steps is not None:
            self.plan(max_steps)
        if self.records is not None:
            raise SpotrayError("spotray.restore: call it once per attempt, before the first step")
        started = time.time()
        candidates = [c for c in self.checkpointer.committed() if c.damage or c.is_files]
        if candidates and not candidates[0].damage:
            check_world_size(self.cfg, candidates[0].world_size, self.env.world_size)
        restored = self.files.restore(directory, candidates)
        self._open(restored.step if restored else 0, restore_s=time.time() - started)
        return restored.step if restored else None

    def should_save(self, step: int) -> bool:
        """At the interval, after a notice, and at the planned last step: what the run ends with is committed."""
        self._ensure_open()
        due = self._save_due(step)
        if due:
            self._save_asked_at = time.perf_counter()
        return due

    def _save_due(self, step: int) -> bool:
        if self._notice is not None:
            return True
        deadline = self.cadence.notice(step, self._mean_step_s())
        if deadline is not None:
            if too_short(deadline, self.files.last_save_s, self.checkpointer.agree):
                self.telemetry.notice(step, time.time(), committed=False)
            else:
                self._notice = (step, deadline, time.time())
                return True
        return self.cadence.save_due(step) or step == self.max_steps

    def commit(self, directory: str, step: int, written_s: float | None = None) -> None:
        """``written_s``: what the script's own save of ``directory`` took, where it knows (a Trainer's); else the
        time since ``should_save`` said to save (none where it did not)."""
        self._ensure_open()
        started = time.perf_counter()
        if written_s is None:
            written_s = started - self._save_asked_at if self._save_asked_at is not None else 0.0
        self._save_asked_at = None
        self.files.commit(directory, step)
        notice = self._notice
        committed = self.files.wait() if notice else None  # a notice's checkpoint must be in storage before going
        waited = time.perf_counter() - started
        log.info("step %d: training waited %.3fs for its commit to start", step, waited)
        blocked = written_s + waited
        self._aside_s += blocked
        self.telemetry.checkpoint(blocked, self.files.last_save_s)
        self.cadence.saved(step, blocked, self.files.last_save_s or blocked, self._mean_step_s())
        if notice is not None:
            assert committed is not None  # waited for above
            self._after_notice(notice, step, committed)

    def _after_notice(self, notice: tuple[int, float, float], step: int, committed: bool) -> None:
        _, deadline, noticed_at = notice
        self._notice = None
        self.telemetry.notice(step, noticed_at, committed=committed)
        if not committed:
            log.warning("preemption notice: the emergency checkpoint of step %d failed; continuing, a restart "
                        "resumes from the last committed checkpoint", step)
            return
        self.stop = move_or_wait(deadline, step, self.checkpointer.agree, self.env.rank, self.env.capacity_elsewhere,
                                 self.telemetry, self.cfg.fault_tolerance.move_on_notice)

    def evaluated(self, step: int, metrics: dict[str, float], seconds: float) -> None:
        """The script evaluated after ``step`` (``val_loss`` ...) for ``seconds``: the eval category's, not a step's
        (less what it compiled: the compile category's)."""
        self._ensure_open()
        self._aside_s += seconds
        self.telemetry.evaluated(step, metrics, max(0.0, seconds - self._compiled()))

    def report(self, step: int, tokens: int | None = None, **metrics: float) -> None:
        """Rank 0's record of ``step``; a second report of a step adds metrics to it (its time is the first's)."""
        self._ensure_open()
        now = time.perf_counter()
        if step not in self.steps:
            since = now - self._last_report_at - self._aside_s - self._compiled()
            seconds, self._last_report_at = max(0.0, since), now
            self._aside_s = 0.0
            self.steps[step] = {"s": seconds}
            self.telemetry.step_done(seconds)
            self.last_step = max(self.last_step, step)
        record = self.steps[step]
        record.update({k: v for k, v in metrics.items() if v is not None})
        self._warn_if_not_kept(metrics)
        if tokens:
            record["tokens"] = tokens
            if isinstance(self.telemetry, RankZeroTelemetry):  # the other ranks' telemetry counts nothing
                self.telemetry.tokens_per_step = tokens
        self._warn_if_never_committed(step)
        if self.env.rank != 0:
            return
        self.losses.record(step, record.get("loss"), record["s"], record.get("learning_rate", record.get("lr")),
                           record.get("grad_norm"), record.get("tokens"))
        self.losses.flush()
        if "loss" in metrics:
            self.telemetry.logged(step, record["loss"], record.get("learning_rate", record.get("lr", 0.0)),
                                  0, self.checkpointer.last_committed,
                                  _rank_zero_memory(self.env.device))

    def should_stop(self) -> bool:
        return self.stop

    def _warn_if_not_kept(self, metrics: dict[str, float]) -> None:
        for name in sorted(set(metrics) - set(STEP_METRICS)):
            if f"metric {name}" in self._warned:
                continue
            self._warned.add(f"metric {name}")
            log.warning("spotray.report: %r is not a step metric (%s) and is not recorded; report an evaluation's "
                        "metrics in `with spotray.evaluating(step) as metrics:`", name, ", ".join(STEP_METRICS))

    def finished_before(self) -> dict | None:
        """The run's final record where this attempt resumed at its step: the script finished there before."""
        self._ensure_open()
        final = ledger.read_final(self.attempts)
        return final if final is not None and final["final_step"] == self.from_step else None

    def finish(self, moved: bool, final: dict | None = None) -> None:
        """The script returned (or moved on): the commit in flight ends, the records are written (``final``: the
        run's final record as a finished run's rerun keeps it)."""
        self._ensure_open()
        self._stop_compile_timer()
        self.files.close()
        if moved:
            self.writer.close(timeout_s=30)
            return
        self.telemetry.finished()
        self.writer.close(timeout_s=max(60.0, self.cfg.checkpoint.save_failure_budget_s))
        if self.env.rank == 0:
            losses = [r["loss"] for _, r in sorted(self.steps.items()) if "loss" in r]
            final = final or {"final_step": self.last_step, "final_loss": losses[-1] if losses else None,
                              "samples_consumed": None, "param_sha256": None, "tokens_per_s": None,
                              "failed_saves": 0}
            ledger.write_final(self.attempts, self.attempt_id, {**final, "attempt_id": self.attempt_id})

    def failed(self, exc: BaseException) -> None:
        self._ensure_open()
        self._stop_compile_timer()
        self.telemetry.failed(exc)
        self.writer.flush(timeout_s=10)

    def _compiled(self) -> float:
        return set_apart(self._compile_timer, self.telemetry)

    def _stop_compile_timer(self) -> None:
        if self._compile_timer is not None:
            self._compile_timer.stop()
            self._compile_timer = None

    def _ensure_open(self) -> None:
        """A script that trains without ``restore`` starts from step 0 (and is told where it could resume)."""
        if self.records is not None:
            return
        committed = list_committed(self.checkpointer.root, warn=False) if self.env.rank == 0 else []
        if committed:
            log.warning("the script did not call spotray.restore: this attempt starts from step 0 although step %d "
                        "is committed", committed[0].step)
        self._open(0, restore_s=0.0)

    def _open(self, from_step: int, restore_s: float) -> None:
        self.from_step = self.last_step = from_step
        self.records = open_records(self.cfg, self.env, self.root, self.attempt_id, from_step)
        self.writer, self.losses, self.attempts = self.records.writer, self.records.losses, self.records.root
        self.checkpointer.records_first = self.writer.check_written  # as the loop's saves (``worker.loop.train``)
        self.telemetry = Telemetry() if self.env.rank != 0 else RankZeroTelemetry(
            attempts_root=self.attempts, attempt=self.records.attempt, entered_at=self.entered_at,
            max_steps=self.max_steps, tokens_per_step=0, flops_per_token=None, peak=None, run_name=self.cfg.run.name,
            writer=self.writer, log_every=self.cfg.train.log_every)
        self.telemetry.started(time.time() - self.entered_at - restore_s, restore_s)
        self.cadence = self._cadence()
        self._compile_timer = CompileTimer().start_once_dynamo_loads()
        self._last_report_at = time.perf_counter()

    def _cadence(self) -> Cadence:
        """Until the script says how many steps it trains, notices are heeded at any step."""
        return Cadence(self.cfg, self.max_steps or sys.maxsize, self.from_step, self.env.device,
                       self.env.preemption_deadline)

    def _mean_step_s(self) -> float:
        timed = [r["s"] for step, r in self.steps.items() if step > self.from_step + 1]
        return sum(timed) / len(timed) if timed else 0.0

    def _warn_if_never_committed(self, step: int) -> None:
        every = nominal_every_steps(self.cfg.checkpoint.every_steps)
        if (step - self.from_step > every and not self.files.committed and not self.files.in_flight
                and "commit" not in self._warned):
            self._warned.add("commit")
            log.warning("step %d: nothing has been checkpointed in %d steps (checkpoint.every_steps=%s): call "
                        "spotray.commit(dir, step) after saving where spotray.should_save(step) is true, or a "
                        "preemption loses every step", step, step - self.from_step, self.cfg.checkpoint.every_steps)


def _rank_zero_memory(device) -> dict[str, list[int] | None]:
    """``memory.all_ranks``' shape with rank 0's figures alone: a report is not a collective."""
    return {kind: None if value is None else [value] for kind, value in memory.this_rank(device).items()}


def check_world_size(cfg: TrainConfig, saved_by: int, workers: int) -> None:
    """A script's checkpoint resumes at the world size that saved it unless ``script.allow_world_size_change``."""
    if saved_by != workers and not cfg.script.allow_world_size_change:
        raise ConfigError("scaling.num_workers",
                          f"{workers} workers, but the run's newest checkpoint was saved by {saved_by}",
                          f"use scaling.num_workers={saved_by}, or set script.allow_world_size_change=true (a "
                          "Trainer then restores no per-rank RNG state, and its data order may differ)")


_current: Session | None = None


def begin(session: Session | None) -> None:
    """The worker's session (None: none), for the public calls below."""
    global _current
    _current = session


def current() -> Session | None:
    return _current


def restore(directory: str, max_steps: int | None = None) -> int | None:
    """Fetch the run's newest committed checkpoint into ``directory`` (once per node) and return its step; None on a
    first start. Call it on every rank, once, before training. ``max_steps``: the steps the script trains (progress
    lines, the interval's bound, and a commit at the last step)."""
    return _current.restore(directory, max_steps) if _current else _outside("restore", None)


def should_save(step: int) -> bool:
    """Whether to save and ``commit`` after ``step``: at checkpoint.every_steps, or at once after a preemption
    notice (the same answer on every rank). Call it on every rank."""
    return _current.should_save(step) if _current else _outside("should_save", False)


def commit(directory: str, step: int) -> None:
    """Upload what the ranks saved to ``directory`` as ``step``'s checkpoint; the commit marker follows once every
    rank's files are in storage. Returns while the upload goes on (except after a notice), so save the next step to
    another directory: the next ``commit`` returns once this upload has ended. Call it on every rank."""
    if _current:
        _current.commit(directory, step)
    else:
        _outside("commit", None)


def report(step: int, tokens: int | None = None, **metrics: float) -> None:
    """Record ``step`` in the run's ledger: its time, ``tokens`` (all ranks'), and metrics (``loss``,
    ``learning_rate``, ``grad_norm``). Rank 0's reports are kept; other ranks may call it too."""
    if _current:
        _current.report(step, tokens, **metrics)
    else:
        _outside("report", None)


@contextlib.contextmanager
def evaluating(step: int) -> Iterator[dict[str, float]]:
    """``with spotray.evaluating(step) as metrics: metrics["val_loss"] = ...``: an evaluation after ``step``. Its
    metrics go where spotray's own evaluations go (progress line, status, gauges, trackers under ``val/``), and its
    time is goodput's ``eval``, not the next step's. Rank 0's are kept; nothing is recorded if the body raises."""
    started = time.perf_counter()
    metrics: dict[str, float] = {}
    yield metrics
    if _current:
        _current.evaluated(step, metrics, time.perf_counter() - started)
    else:
        _outside("evaluating", None)


def should_stop() -> bool:
    """True once a notice's checkpoint committed and the worker group moves to other capacity: end training
    without the work that follows a finished run (the attempt ends; the run resumes elsewhere)."""
    return _current.should_stop() if _current else False


_told: set[str] = set()


def _outside(call: str, result):
    if not _told:
        log.warning("spotray.%s: not running under `spotray train --script`: spotray's calls do nothing here", call)
    _told.add(call)
    return result
