"""Driver side of ``spotray train``: run the loop on Ray Train's TorchTrainer and summarise the run."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any, TextIO

import ray
import ray.train
import torch.distributed as dist
from ray.train.torch import TorchConfig

# What ray.train and ray.train.torch serve under Train V2, named where the checker can see them.
from ray.train.v2.api.config import FailureConfig, RunConfig, ScalingConfig
from ray.train.v2.torch.torch_trainer import TorchTrainer

from spotray.accounts import cost, endings, goodput, ledger
from spotray.accounts.node_records import NodeRecorder
from spotray.accounts.prices import price_book, read_prices_file
from spotray.checkpoints.dcp import best_checkpoint, checkpoints_root, kept_interval, list_committed
from spotray.config import ScalingSection, TrainConfig, from_dict
from spotray.driver.console import WORKER_FORMAT
from spotray.driver.failure_budget import FailureBudget, charges, preemptions_spent, verdict
from spotray.driver.head_watch import HeadWatch
from spotray.driver.lease import DriverLease, check_free
from spotray.driver.node_watch import EVIDENCE_AT_END_S, NodeWatch, awaiting_evidence
from spotray.driver.placement import group_fits, holds, resources_text, worker_group_placement
from spotray.driver.progress import ProgressMonitor
from spotray.driver.resize import ControllerToKeeper, EndWithoutReplacement, KeepOff, ShrinkOnLoss, restart_size
from spotray.driver.runtime_env import enter_working_dir, shipped, worker_runtime_env
from spotray.errors import ClusterLost, SpotrayError, StorageError, TrainingFailed, root_cause
from spotray.formats import workers
from spotray.ray_local import join_or_start
from spotray.ray_nodes import drain_deadline
from spotray.snapshots.holders import remove_holders, snapshot_root
from spotray.step import evaluation
from spotray.storage import Location, resolve
from spotray.survivors.backend import SurvivorsTorchConfig, keeps_survivors
from spotray.survivors.generations import NOTHING_LOST, Seat
from spotray.survivors.keeper import start_keeper
from spotray.survivors.member import Member
from spotray.tasks import Task
from spotray.tasks.load import load_task
from spotray.tracking import Follower, check_installed, read_gaps
from spotray.worker import memory, user_script
from spotray.worker.attempt import WorkerEnv, run_root
from spotray.worker.loop import GrowingBack, train, units_per_step

log = logging.getLogger(__name__)

# Ray Train polls its workers every 2 s and the nodes' drain state every 5 s by default: seconds added to every start,
# end, failure and notice (a 10-step run took 33 s against 27.5 s at these). Each poll is one small call per worker.
RAY_TRAIN_POLLS_S = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1"}
HEAD_LOST = (endings.HEAD_LOST, "the Ray head stopped answering the driver")
MOVED = "moved"  # an attempt that ended on a notice, to be started again on other capacity
GROWN = "grown"  # a fit below scaling.num_workers that ended at a committed step, to be started with more workers


@dataclasses.dataclass(frozen=True)
class Start:
    """How a fit starts: its workers, kept off the nodes found lost before it."""

    workers: int
    keep_off: tuple[str, ...] = ()


class ReplacementFailed(Exception):  # noqa: N818 - an outcome the driver goes on from
    """Ray Train's controller failed replacing a lost worker of the survivors' run; its cause, in one line."""


class GroupSetupFailed(Exception):  # noqa: N818 - an outcome the driver goes on from, once
    """The workers' process group could not be set up (its rendezvous port taken meanwhile, its master not reached);
    its cause, in one line."""


def ray_train_fn(config: dict) -> None:
    """Runs on every Ray Train worker: build everything heavy here from the small config dict.

    Checkpoints are not registered with Ray: resuming reads them from storage itself, and Ray's controller would
    otherwise write its own snapshot at every checkpoint, which a storage outage turns into a failed run."""
    _worker_logging()
    cfg = from_dict(config)
    enter_working_dir(cfg)
    if keeps_survivors(cfg):
        _train_in_generations(cfg)
        return
    context = ray.train.get_context()
    snapshots = (snapshot_root(run_root(cfg).url, cfg.snapshot.max_bytes)
                 if cfg.snapshot.enabled and not cfg.script.path else None)
    env = WorkerEnv(context.get_world_rank(), context.get_world_size(), ray.train.torch.get_device(),
                    ray.train.report, _preemption_deadline, lambda: group_fits(cfg.scaling, _preempted_nodes),
                    snapshots, lambda: group_fits(cfg.scaling, ()))
    if cfg.script.path:
        user_script.run_on_worker(cfg, env)
    else:
        train(cfg, env)


def _train_in_generations(cfg: TrainConfig) -> None:
    """The survivors' worker (``spotray.survivors``): ``train`` once per generation in this process, each attempt
    restoring the newest state (its node's snapshot) at the generation's size. A failure goes on in the next
    generation where a member was lost, and is raised as before where none was. A fit the driver started below
    ``scaling.num_workers`` ends itself once the cluster holds more workers than it has, for the driver to start
    one with the workers that fit then."""
    member = Member(run_root(cfg).url)
    fit_size = ray.train.get_context().get_world_size()
    small_fit = fit_size < cfg.scaling.num_workers
    after_failure, failure = False, None
    try:
        while isinstance(seat := member.join(after_failure), Seat):
            try:
                result = train(cfg, _generation_env(cfg, member, seat, fit_size))
            except GrowingBack:
                if small_fit and seat.rank == 0 and holds(cfg.scaling, fit_size + 1):
                    member.finish()  # every worker, a newcomer waiting at the keeper too, returns: the fit ends
                after_failure = False  # else a newcomer joins the next generation
                continue
            except Exception as exc:  # not SystemExit/KeyboardInterrupt: that is Ray stopping the worker
                after_failure, failure = True, _without_locals(exc)
                continue
            if "ended_to_restart" not in result:  # moved on a notice: the next generation goes on without its node
                if seat.rank == 0:
                    member.finish()
                return
            after_failure = False
        if seat == NOTHING_LOST and failure is not None:
            raise failure
    finally:
        member.leave()


def _without_locals(exc: BaseException) -> BaseException:
    """``exc`` (and the errors it chains) keeping its traceback's lines, not their frames' variables: those hold the
    failed generation's process groups (the model's DDP wrapper), whose connections close only once nothing does,
    and a member still inside one of its collectives waits on them until the group's timeout."""
    chained: BaseException | None = exc
    seen = set()
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        traceback.clear_frames(chained.__traceback__)
        chained = chained.__cause__ or chained.__context__
    return exc


def _generation_env(cfg: TrainConfig, member: Member, seat: Seat, fit_size: int) -> WorkerEnv:
    """A generation grows back with the newcomers Ray started in place of lost workers; in a fit smaller than
    ``scaling.num_workers``, also once the cluster holds more workers than the fit has."""
    snapshots = snapshot_root(run_root(cfg).url, cfg.snapshot.max_bytes) if cfg.snapshot.enabled else None
    grows = (functools.partial(_room_for_more, member, cfg.scaling, fit_size) if fit_size < cfg.scaling.num_workers
             else member.newcomers_wait)
    return WorkerEnv(seat.rank, seat.world_size, ray.train.torch.get_device(), _no_report,
                     functools.partial(member.drain_deadline, seat.rank), member.others_suffice, snapshots, grows)


def _room_for_more(member: Member, scaling: ScalingSection, fit_size: int) -> bool:
    return member.newcomers_wait() or holds(scaling, fit_size + 1)


def _no_report(metrics: dict) -> None:
    """Ray Train's report is a barrier over every worker Ray started: it would wait for a lost one."""


def _worker_logging() -> None:
    """spotray's INFO lines reach the driver's log once each, its warnings marked for the driver's terminal; Ray's
    own lines stay at their level."""
    logger = logging.getLogger("spotray")
    logger.setLevel(logging.INFO)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(WORKER_FORMAT))
        logger.addHandler(handler)
        logger.propagate = False


_preempted_nodes: set[str] = set()  # of the notice this worker last saw


def _preemption_deadline() -> float | None:
    info = ray.train.get_preemption_info()
    if info is None:
        return None
    _preempted_nodes.update(info.preempted_node_ids)
    return drain_deadline(info.deadline_ms)


def failure_config() -> FailureConfig:
    """Ray Train retries every failure: spotray's ``FailureBudget`` ends the run when its budgets are spent."""
    return FailureConfig(max_failures=-1, max_preemption_failures=-1)


def preflight(cfg: TrainConfig) -> Task | None:
    """Fail fast on the driver before any worker starts: every configured tracker's library imports, the prices file
    reads, and the task loads and opens its dataset (for the built-in tasks: the dataset index and the model config
    only), or the script is there (None: a script has no task); then the run's storage takes a write, and no other
    driver trains the run."""
    check_installed(cfg.tracking)
    if cfg.cost.prices_file:
        read_prices_file(cfg.cost.prices_file, cfg.storage.options())
    task = None
    if cfg.script.path:
        user_script.preflight(cfg, run_root(cfg))
    else:
        task = load_task(cfg)
        task.open_dataset()
        if cfg.evaluates:
            evaluation.preflight(cfg, task)
    run_root(cfg).check_writable()
    check_free(ledger.attempts_root(run_root(cfg)), cfg.run.name)
    return task


_UNCHECKED: Any = object()  # ``run``'s caller did not run ``preflight`` (a script's run has no task: None)


def run(cfg: TrainConfig, worker_logs: bool = True, console: TextIO | None = None,
        task: Task | None = _UNCHECKED) -> dict:
    """Train (or resume) ``cfg.run.name`` on the Ray cluster at RAY_ADDRESS, or a local one. Returns the summary.
    Progress and interruption lines go to ``console`` (default: stderr); ``task``: what ``preflight`` returned, if
    the caller ran it."""
    cfg = with_absolute_paths(cfg)
    task = preflight(cfg) if task is _UNCHECKED else task
    prices = price_book(cfg.cost, cfg.storage.options())
    tokens_per_step = units_per_step(cfg, task) if task else 0
    root = run_root(cfg)
    if (done := _finished_at(cfg, root)) is not None:
        limit = "train.stop_at_step" if cfg.train.stop_at_step else "train.max_steps"
        (console or sys.stderr).write(f"spotray: run '{cfg.run.name}' finished at step {done} already: nothing to "
                                      f"train (raise {limit} to train on)\n")
        return summarize(cfg, len(task.open_dataset()) if task else 0, root)
    workers_cfg = shipped(cfg, root)  # refuses an oversized working dir before Ray starts
    runtime_env = worker_runtime_env(cfg)
    _ensure_ray(cfg, worker_logs)
    _remove_snapshots(root)  # a driver before this one left them: they may be of another lineage
    attempts = root.child("attempts")
    ledger.mark_run_started(attempts)
    nodes = NodeWatch(attempts, NodeRecorder(attempts, cfg.cost, prices))
    follower = Follower(cfg, root, stream=console)  # the run's experiment trackers, fed from the ledger
    head = HeadWatch(ray.get_runtime_context().gcs_address if ray.is_initialized() else None)
    ending: tuple[str | None, str] = (None, "")  # how the newest attempt ended, where only this driver knows
    started_at = time.time()
    lease = DriverLease(attempts, cfg.run.name).start(_newest_attempt(attempts))
    try:
        with _stop_on_sigterm(), head, ProgressMonitor(
                attempts, tokens_per_step, stream=console, nodes=nodes,
                placement=functools.partial(worker_group_placement, cfg.scaling)), follower:
            _fit_until_done(cfg, workers_cfg, runtime_env, root, console)
            _await_evidence(attempts, started_at, console, nodes.gone)
    except TrainingFailed as exc:
        ending = (endings.DRIVER_FAILED, str(exc))
        raise
    except (KeyboardInterrupt, SystemExit) as exc:  # SystemExit: Ray Train's own Ctrl-C handler, once it aborted
        if not head.lost:
            ending = (endings.STOPPED, str(exc) if isinstance(exc, KeyboardInterrupt) and str(exc) else "Ctrl-C")
            raise KeyboardInterrupt(ending[1]) from None
        ending = HEAD_LOST
        raise _cluster_lost(cfg, root) from None
    except ray.exceptions.RayActorError as exc:  # Ray Train's controller is gone: with the head, or on its own
        if head.answers():
            ending = (endings.DRIVER_FAILED, f"Ray Train's controller stopped ({root_cause(exc)[:200]})")
            raise TrainingFailed(f"training run '{cfg.run.name}' failed: Ray Train's controller stopped "
                                 f"({root_cause(exc)[:200]})") from exc
        ending = HEAD_LOST
        raise _cluster_lost(cfg, root) from exc
    except Exception as exc:  # Ray wraps worker errors; show the root cause in one line
        cause = root_cause(exc)
        ending = (endings.DRIVER_FAILED, cause[:200])  # an error a worker recorded is the attempt's own ending
        failed_script = f"{user_script.ScriptFailed.__module__}.{user_script.ScriptFailed.__name__}: "
        if cause.startswith(failed_script):
            raise user_script.ScriptFailed(cause.removeprefix(failed_script)) from exc
        raise TrainingFailed(f"training run '{cfg.run.name}' failed: {cause}") from exc
    finally:
        lease.stop()
        _end_driver(attempts, root, ending, head.lost)
    if cfg.script.path and (done := _script_trained_nothing(attempts)) is not None:
        (console or sys.stderr).write(f"spotray: run '{cfg.run.name}' finished at step {done} already: nothing to "
                                      "train (raise the script's max steps to train on)\n")
    summary = summarize(cfg, len(task.open_dataset()) if task else 0, root)
    follower.finish(summary)
    return summary


def _finished_at(cfg: TrainConfig, root: Location) -> int | None:
    """The step a run of the loop finished at, where it trained to its last step already and recorded its final
    metrics: the same command run again books no workers for it. None where there is something to train."""
    if cfg.script.path:  # a script's last step is its own
        return None
    final = ledger.read_final(root.child("attempts"))
    if final is None or final["final_step"] < (cfg.train.stop_at_step or cfg.train.max_steps):
        return None
    committed = list_committed(checkpoints_root(root), warn=False)
    # Trained past it since (and lost before a final record): the workers resume there and finish it.
    return final["final_step"] if committed and committed[0].step == final["final_step"] else None


def _script_trained_nothing(attempts: Location) -> int | None:
    """The step a script's newest attempt resumed at and finished at, training nothing: a rerun of a finished run
    (``session.FinishedAlready``). None where it trained a step, or did not finish."""
    newest = ledger.read_attempts(attempts)[-1]
    final = ledger.read_final(attempts) if ledger.attempt_finished(attempts, newest.attempt_id) else None
    return newest.from_step if final and final["final_step"] == newest.from_step > 0 else None


def _fit_until_done(cfg: TrainConfig, workers_cfg: TrainConfig, runtime_env: dict | None, root: Location,
                    console: TextIO | None) -> None:
    """``_fit`` until the run is done, started again after an attempt that moved on a preemption notice (on the
    other capacity), after a fit below the whole group ended to grow, or where Ray Train failed to replace the
    survivors' lost workers (these two with the workers that fit). Within a fit, Ray Train restarts the workers (also to
    grow back to the whole group), ``FailureBudget`` keeps the budgets and ``ShrinkOnLoss`` sizes the restarts."""
    attempts = root.child("attempts")
    budget = FailureBudget(attempts.url, cfg.storage.options(), cfg.fault_tolerance, cfg.run.name, time.time())
    whole = Start(cfg.scaling.num_workers)
    start, setup_failed = whole, False
    while True:
        try:
            ended = _fit_through_storage_outages(cfg, workers_cfg, runtime_env, root, console, budget, start)
        except GroupSetupFailed as exc:  # a port taken between Ray choosing it and binding it: not the run's fault
            if setup_failed:
                raise TrainingFailed(f"training run '{cfg.run.name}' failed: the workers' process group could not "
                                     f"be set up, twice in a row ({exc})") from exc
            setup_failed = True
            (console or sys.stderr).write(f"spotray: the workers' process group could not be set up ({exc}): "
                                          "starting the workers again\n")
            continue
        except ReplacementFailed as exc:
            if (newest := _newest_attempt(attempts)) and ledger.attempt_finished(attempts, newest):
                return  # the survivors trained to the end while Ray Train was still replacing their lost workers
            _record_restarted(attempts)
            why = verdict(cfg.fault_tolerance, cfg.run.name, charges(attempts, budget.since, 0),
                          f"training run '{cfg.run.name}' failed: {exc}")
            if why:
                raise TrainingFailed(why) from exc
            start = Start(*restart_size(cfg.scaling))
            (console or sys.stderr).write(f"spotray: Ray Train failed replacing a lost worker ({exc}): starting the "
                                          f"workers again from the run's newest state, {_of(start, whole)}\n")
            continue
        setup_failed = False
        if ended is None:
            return
        if ended == MOVED and (why := preemptions_spent(cfg.fault_tolerance, cfg.run.name,
                                                        charges(attempts, budget.since, 0))):
            raise TrainingFailed(why)
        start = Start(*restart_size(cfg.scaling)) if ended == GROWN else whole


def _await_evidence(attempts: Location, since: float, console: TextIO | None,
                    gone: Callable[[set[str]], set[str]]) -> None:
    """Until the progress monitor's watch has recorded why the attempts that held nodes lost in the run's last
    seconds ended (Ray marks such a node dead about 15 s after; the watch lists Kubernetes's nodes every 10 s), at
    most ``EVIDENCE_AT_END_S``: they would otherwise read as unknown, not as the spot interruptions they were.
    ``gone``: which nodes are lost (``NodeWatch.gone``)."""
    deadline, said = time.monotonic() + EVIDENCE_AT_END_S, False
    with _best_effort("why the run's last attempts ended"):
        while (lost := awaiting_evidence(attempts, since, gone)) and time.monotonic() < deadline:
            if not said:
                (console or sys.stderr).write(
                    f"spotray: waiting up to {EVIDENCE_AT_END_S:.0f}s for the evidence on the lost node(s) "
                    f"{', '.join(lost)}, to record why the attempts that held them ended\n")
                said = True
            time.sleep(1.0)


def _of(start: Start, whole: Start) -> str:
    if start.workers == whole.workers:
        return f"all {whole.workers} workers (waiting for capacity where the cluster lacks it)"
    return f"{start.workers} of {whole.workers} workers (the ones that fit; growing back when capacity returns)"


def _newest_attempt(attempts: Location) -> str | None:
    newest = ledger.read_attempts(attempts)[-1:]
    return newest[0].attempt_id if newest else None


def _end_driver(attempts: Location, root: Location, ending: tuple[str | None, str], head_lost: bool) -> None:
    """Records how this driver ended, then removes the run's snapshot holders unless the head was lost (seen by the
    watch, or by the controller's loss while the head did not answer): they went with it, and a call to a lost head
    waits until Ray ends this process without a word, before the run's one line is printed."""
    _record_driver_end(attempts, *ending)
    if not head_lost and ending[0] != endings.HEAD_LOST:
        _remove_snapshots(root)


def _remove_snapshots(root: Location) -> None:
    """Best effort: the cluster may be gone, and its snapshots with it."""
    try:
        remove_holders(root.url)
    except Exception as exc:  # Ray's errors when its head is gone are not one type
        log.warning("could not remove the run's snapshot holders: %s", exc)


def _record_restarted(attempts: Location) -> None:
    """The newest attempt's ending, where no node loss is on record for it."""
    with _best_effort("how the attempt ended"):
        if newest := _newest_attempt(attempts):
            endings.record(attempts, newest, endings.RESTARTED, endings.DESCRIPTIONS[endings.RESTARTED])


def _record_driver_end(attempts: Location, kind: str | None, reason: str) -> None:
    with _best_effort("how this driver ended"):
        endings.driver_ended(attempts, _newest_attempt(attempts), kind, reason)


@contextlib.contextmanager
def _best_effort(record: str) -> Iterator[None]:
    """Storage may be what failed, and the error the user sees must stay the run's own."""
    try:
        yield
    except (SpotrayError, OSError) as exc:
        log.warning("could not record %s: %s", record, exc)


@contextlib.contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """SIGTERM of the driver is a stop by the user, as Ctrl-C is (where this runs in the main thread)."""
    def stop(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _cluster_lost(cfg: TrainConfig, root: Location) -> ClusterLost:
    committed = list_committed(checkpoints_root(root), warn=False)
    resume = f"step {committed[0].step}" if committed else "the start"
    return ClusterLost(f"training run '{cfg.run.name}' lost its Ray cluster (its head stopped answering); run the "
                       f"same command again, on a new cluster if need be, to resume from {resume}")


def _fit_through_storage_outages(cfg: TrainConfig, workers_cfg: TrainConfig, runtime_env: dict | None,
                                 root: Location, console: TextIO | None, budget: FailureBudget,
                                 start: Start) -> str | None:
    """``_fit``, started again when Ray Train's controller failed to start: it writes a marker in storage as it
    starts, so an outage would otherwise end the run. Started once more at once (the outage may be over already),
    then again whenever storage answers, within checkpoint.save_failure_budget_s as for saves."""
    storage = resolve(cfg.checkpoint.path, cfg.storage.options())
    deadline = time.monotonic() + cfg.checkpoint.save_failure_budget_s
    failed_with_storage_up = False
    while True:
        try:
            return _fit(workers_cfg, runtime_env, root, budget, start)
        except ray.exceptions.RayActorError as exc:
            if not exc.actor_init_failed:
                raise
            storage_up = storage.reachable()
            if storage_up and failed_with_storage_up:
                raise TrainingFailed(f"training run '{cfg.run.name}' failed: Ray Train's controller did not start "
                                     f"({root_cause(exc)[:200]})") from exc
            failed_with_storage_up = storage_up
            (console or sys.stderr).write(f"spotray: the attempt did not start ({root_cause(exc)[:120]}): starting "
                                          "it again once storage answers\n")
            while not storage.reachable():
                if time.monotonic() > deadline:
                    raise StorageError(
                        f"storage {storage.url} stayed unreachable for checkpoint.save_failure_budget_s="
                        f"{cfg.checkpoint.save_failure_budget_s:g}s; run the same command again once it answers"
                    ) from exc
                time.sleep(2)


def header(cfg: TrainConfig, log: str, verbose: bool = False) -> list[str]:
    """What ``spotray train`` says first: the run, where it trains, where its checkpoints and log go."""
    scaling, root = cfg.scaling, run_root(with_absolute_paths(cfg))
    what = f"script {cfg.script.path}" if cfg.script.path else f"{cfg.train.max_steps} steps"
    return [f"run {cfg.run.name}: {what} on {workers(scaling.num_workers)} "
            f"({resources_text(scaling.worker_resources)} each, "
            f"{cfg.parallel.upper()} over {scaling.backend}); checkpoints in {checkpoints_root(root).url}",
            f"log {log}{'' if verbose else ' (--verbose shows it here)'}", *_precision_note(cfg)]


def _precision_note(cfg: TrainConfig) -> list[str]:
    """PyTorch multiplies float32 matrices in full float32 (TF32 off), which a GPU bill pays for several times over."""
    if cfg.script.path or not cfg.scaling.use_gpu or cfg.train.dtype != "float32":
        return []
    return ["note: train.dtype is float32, so every matrix product runs in full float32, several times slower than "
            "bfloat16 on the tensor cores of A10G, L4, L40S, A100 and H100-class GPUs (a T4 has none for bfloat16): "
            "set train.dtype: bfloat16 unless the model needs float32"]


def log_location(cfg: TrainConfig) -> Location:
    """This command's log file, beside the run's ledger."""
    return run_root(with_absolute_paths(cfg)).child("logs", time.strftime("train-%Y%m%d-%H%M%S.log"))


def _fit(cfg: TrainConfig, runtime_env: dict | None, root: Location, budget: FailureBudget,
         start: Start) -> str | None:
    """One Ray Train run of the loop (``cfg`` as the workers get it); how its last attempt ended where it ended to
    be started again (``MOVED`` on a notice, ``GROWN`` to grow back), else None. Raises ``ReplacementFailed``."""
    storage = resolve(cfg.checkpoint.path, cfg.storage.options())
    if cfg.script.path:  # read by TorchTrainer: a script's workers stay in its folder, as under torchrun
        os.environ["RAY_CHDIR_TO_TRIAL_DIR"] = "0"
    keeper = start_keeper(root.url, start.workers, cfg.scaling.fewest_workers) if keeps_survivors(cfg) else None
    callbacks: list = [budget, KeepOff(start.keep_off),  # Ray runs a ControllerCallback given as a UserCallback too
                       ControllerToKeeper(root.url) if keeper is not None else ShrinkOnLoss(cfg.scaling)]
    trainer = TorchTrainer(
        ray_train_fn,
        train_loop_config=cfg.to_dict(),
        scaling_config=ScalingConfig(
            num_workers=start.workers,
            use_gpu=cfg.scaling.use_gpu,
            resources_per_worker=cfg.scaling.resources_per_worker or None,
        ),
        torch_config=(SurvivorsTorchConfig if keeper is not None else TorchConfig)(backend=cfg.scaling.backend),
        run_config=RunConfig(
            name=cfg.run.name,
            storage_path=storage.path,
            storage_filesystem=storage.fs,
            failure_config=failure_config(),
            callbacks=callbacks,
            worker_runtime_env=runtime_env,
        ),
    )
    try:
        with ray_train_polls(os.environ), _sigint_handler_kept(), (
                EndWithoutReplacement(keeper) if keeper is not None else contextlib.nullcontext()) as ender:
            trainer.fit()
    except ray.exceptions.RayActorError:
        if not (ender and ender.ended):
            raise
    except ray.train.ControllerError as exc:
        if _process_group_failed(exc):
            raise GroupSetupFailed(root_cause(exc.controller_failure).strip()[:200]) from exc
        # Ray Train replaces a lost survivor's worker alone, and fails where it calls another worker of the group that
        # was lost too (two nodes lost at once): the run goes on from its newest state in a new fit.
        if keeper is None or not isinstance(exc.controller_failure, ray.exceptions.RayActorError):
            raise
        raise ReplacementFailed(root_cause(exc.controller_failure).strip()[:200]) from exc
    attempts = root.child("attempts")
    last = ledger.read_attempts(attempts)[-1:]
    status = (goodput.read_status(attempts, last[0].attempt_id) or {}) if last else {}
    return MOVED if status.get("moved_at") else GROWN if status.get("grew") else None


def _process_group_failed(failure: BaseException | None) -> bool:
    """Whether Ray Train's controller stopped (``ControllerError``) because the workers' process group was not set
    up: the error of Ray's setup task, or what it holds (``cause``), is the rendezvous's own."""
    while failure is not None:
        if isinstance(failure, dist.DistNetworkError):
            return True
        failure = (getattr(failure, "controller_failure", None) or getattr(failure, "cause", None)
                   or failure.__cause__)
    return False


@contextlib.contextmanager
def _sigint_handler_kept() -> Iterator[None]:
    """Ray Train's fit leaves its Ctrl-C handler installed, and after the fit that handler calls the ended controller
    and fails with a traceback: the handler from before the fit (a KeyboardInterrupt) is put back."""
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        if before is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, before)


@contextlib.contextmanager
def ray_train_polls(environ: MutableMapping[str, str]) -> Iterator[None]:
    """spotray's poll intervals for the Ray Train run started inside (its controller takes them from the driver's
    environment), unless the operator set their own; the environment is as it was afterwards."""
    added = [name for name in RAY_TRAIN_POLLS_S if name not in environ]
    environ.update({name: RAY_TRAIN_POLLS_S[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            environ.pop(name, None)


def with_absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """Local relative paths made absolute here: Ray's workers run in another directory."""
    def absolute(url: str) -> str:
        return os.path.abspath(url) if url and "://" not in url else url

    def absolute_or_none(url: str | None) -> str | None:
        return None if url is None else absolute(url)

    hf = cfg.model.hf and dataclasses.replace(
        cfg.model.hf, config=cfg.model.hf.config if isinstance(cfg.model.hf.config, dict) else absolute_or_none(
            cfg.model.hf.config), pretrained=absolute_or_none(cfg.model.hf.pretrained))
    return dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, path=absolute(cfg.data.path)),
        model=dataclasses.replace(cfg.model, hf=hf),
        checkpoint=dataclasses.replace(cfg.checkpoint, path=absolute(cfg.checkpoint.path)),
        audit_dir=absolute_or_none(cfg.audit_dir))


def summarize(cfg: TrainConfig, num_samples: int, root: Location) -> dict:
    attempts = root.child("attempts")
    final = ledger.read_final(attempts)
    if final is None:
        raise TrainingFailed(f"run '{cfg.run.name}' has no finished attempt under {attempts.url}")
    losses = ledger.lineage_losses(attempts)
    # A script logs its loss every few steps, and an attempt may train no step: the last loss of the history.
    loss_step = max((step for step in losses if step <= final["final_step"]), default=None)
    time_account = goodput.account(attempts).to_dict()
    committed = list_committed(checkpoints_root(root))
    summary = {
        "run_name": cfg.run.name,
        "final_step": final["final_step"],
        "final_loss": final["final_loss"] if loss_step is None else losses[loss_step],
        "final_loss_step": final["final_step"] if loss_step is None else loss_step,
        "samples_consumed": final["samples_consumed"],
        "param_sha256": final["param_sha256"],
        "tokens_per_s": final["tokens_per_s"],
        "goodput": time_account.pop("goodput"),
        "cost": cost.run_cost(attempts).to_dict(),
        "events": time_account.pop("events"),
        "spot_interruptions": time_account.pop("interruptions"),
        "lost_steps": time_account.pop("lost_steps"),
        "lost_steps_at_most": time_account.pop("lost_steps_at_most"),
        "time": time_account,
        "failed_saves": final.get("failed_saves", 0),
        "tracking_gaps": read_gaps(root),
        "checkpoint_every_steps": _cadence(cfg, committed),
        "exactly_once": None,
        "checkpoints": [c.url for c in reversed(committed)],
        "losses": {str(step): loss for step, loss in losses.items()},
        **_evaluations(attempts, checkpoints_root(root)),
        "memory": memory.highest([r["memory"] for r in ledger.lineage_intervals(attempts).values() if r.get("memory")]),
    }
    if cfg.audit_dir:
        audit = ledger.verify_exactly_once(resolve(cfg.audit_dir, cfg.storage.options()), num_samples,
                                           final["final_step"])
        summary["exactly_once"] = audit.exactly_once
        summary["audit"] = {"exactly_once": audit.exactly_once, "samples": audit.samples,
                            "duplicates": audit.duplicates, "missing_steps": audit.missing_steps}
    return summary


def _cadence(cfg: TrainConfig, committed: list) -> int | str | None:
    """The checkpoint interval the run used: a script's own, as its kept checkpoints show (None where they cannot
    tell), else ``checkpoint.every_steps``."""
    return kept_interval([c.step for c in committed]) if cfg.script.path else cfg.checkpoint.every_steps


def _evaluations(attempts: Location, checkpoints: Location) -> dict:
    """The final model's evaluations, the last val loss, and the best checkpoint kept (checkpoint.keep_best)."""
    evals = ledger.lineage_evals(attempts)
    best = best_checkpoint(list_committed(checkpoints))
    return {"evals": {str(step): record["metrics"] for step, record in evals.items()},
            "val_loss": evals[max(evals)]["metrics"].get("val_loss") if evals else None,
            "best": {"step": best.step, "val_loss": best.val_loss, "url": best.url} if best else None}


def write_summary(summary: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(summary, indent=2) + "\n")


def _ensure_ray(cfg: TrainConfig, worker_logs: bool) -> None:
    """Connects to the cluster at RAY_ADDRESS, or starts a local Ray with a CPU for the driver's actors."""
    join_or_start(max(os.cpu_count() or 1, cfg.scaling.num_workers + 1), log_to_driver=worker_logs)


def leave_ray() -> None:
    """Disconnects from Ray, stopping the local Ray this process started."""
    ray.shutdown()
