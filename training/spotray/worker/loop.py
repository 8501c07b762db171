"""The training loop, independent of the launcher (Ray Train or a bare process group)."""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import logging
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from spotray.accounts import ledger
from spotray.checkpoints.dcp import (
    Checkpointer,
    CommittedCheckpoint,
    RestorePrefetch,
    RngState,
    write_model_record,
)
from spotray.config import TrainConfig
from spotray.errors import OutOfMemory
from spotray.snapshots.store import Snapshots
from spotray.step.batches import split, to_device
from spotray.step.evaluation import Evaluator, open_val_dataset
from spotray.step.optim import allocate_state, build_optimizer, build_scheduler
from spotray.step.parallel import gradient_sync, parallelize
from spotray.step.sampler import ElasticSampler
from spotray.storage import Location
from spotray.tasks import Samples, Task, TaskError
from spotray.tasks.load import load_task
from spotray.worker import memory
from spotray.worker.attempt import Records, WorkerEnv, open_records, run_root, shared_attempt_id
from spotray.worker.cadence import (
    Cadence,
    GrowBack,
    SnapshotInterval,
    SnapshotSlowdown,
    move_or_wait,
    nominal_every_steps,
    rank0_decides,
    slowest_rank,
    snapshot_cost_s,
    too_short,
)
from spotray.worker.compile_cache import CompileCache
from spotray.worker.compile_time import CompileTimer, set_apart
from spotray.worker.telemetry import RankZeroTelemetry, Telemetry, peak_flops

log = logging.getLogger(__name__)

class MovedOnNotice(Exception):  # noqa: N818 - an outcome, not an error
    """The attempt committed its emergency checkpoint and ends so that the run restarts on other capacity."""


class GrowingBack(Exception):  # noqa: N818 - an outcome, not an error
    """The attempt, below scaling.num_workers, committed its step and fails its group on purpose: Ray Train restarts
    it within the same fit at the configured size (no node was lost, so ``ShrinkOnLoss`` leaves Ray's size), which
    skips ending the fit and starting a new controller. Its ledger ending, a resize, is charged to no budget."""


class ModelOptimState:
    """Model + optimizer as one Stateful; DCP state dicts reshard across world sizes and DDP/FSDP."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


class Progress:
    def __init__(self):
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


class _Prefetcher:
    """Reads the next step's batch in a background thread while the current step computes."""

    def __init__(self, dataset: Samples):
        self.dataset = dataset
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending: tuple[list[int], Future[torch.Tensor | dict[str, torch.Tensor]]] | None = None

    def get(self, ids: list[int], next_ids: list[int] | None):
        batch = self.pending[1].result() if self.pending and self.pending[0] == ids else self.dataset.batch(ids)
        self.pending = (next_ids, self.pool.submit(self.dataset.batch, next_ids)) if next_ids else None
        return batch


def param_sha256(model: torch.nn.Module) -> str | None:
    """SHA-256 of the full (gathered) parameters on rank 0; None on other ranks."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    digest = hashlib.sha256()
    for key in sorted(full):
        digest.update(key.encode())
        tensor = cast(torch.Tensor, full[key])  # a full state dict's values are tensors
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class _StepRunner:
    """One optimizer step over a per-rank batch, split into micro-batches with gradient accumulation."""

    def __init__(self, cfg: TrainConfig, task: Task, model, optimizer, scheduler, env: WorkerEnv):
        self.task, self.model, self.optimizer, self.scheduler, self.env = task, model, optimizer, scheduler, env
        self.micro = cfg.train.micro_batch_size or cfg.per_worker_batch(env.world_size)
        self.clip = cfg.train.grad_clip
        self.bf16 = cfg.train.dtype == "bfloat16"
        # Each rank's loss sum is scaled so that the data-parallel gradient average equals the gradient of the mean
        # loss over the whole global batch, whatever the world size: the task's per-step denominator is constant.
        self.scale = env.world_size / (cfg.train.global_batch_size * task.units_per_sample)
        self.unsettled = isinstance(model, DistributedDataParallel) and env.world_size > 2

    def __call__(self, batch) -> StepResult:
        chunks = split(to_device(batch, self.env.device), self.micro)
        if self.unsettled:
            self._settle_buckets(chunks[0])
        loss_sum, units = torch.zeros((), device=self.env.device), 0
        for i, chunk in enumerate(chunks):
            with gradient_sync(self.model, enabled=i == len(chunks) - 1):
                with torch.autocast(self.env.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                    loss, n = self.task.loss(self.model, chunk)
                (loss * self.scale).backward()
            loss_sum += loss.detach()
            units += n
        grad_norm = self._grad_norm()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return StepResult(loss_sum, units, grad_norm, lr)

    def _settle_buckets(self, chunk) -> None:
        """DDP regroups its gradient buckets after its first synchronised backward, and with more than 2 ranks the
        all-reduce's sums depend on the grouping (2 summands add alike in any order). One zero-weighted backward at
        the start of every attempt gives every step the regrouped buckets, so that a resumed run sums as the
        uninterrupted one did: bitwise. It draws nothing from the random generators and leaves no gradient."""
        self.unsettled = False
        devices = [self.env.device] if self.env.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.autocast(self.env.device.type, dtype=torch.bfloat16,
                                                                      enabled=self.bf16):
            loss, _ = self.task.loss(self.model, chunk)
        (loss * 0.0).backward()
        self.optimizer.zero_grad(set_to_none=True)

    def _grad_norm(self) -> torch.Tensor:
        """The global gradient norm (clipped to ``train.grad_clip`` where set), not synchronised to the host."""
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        if self.clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(parameters, self.clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
        return norm.full_tensor() if isinstance(norm, DTensor) else norm


@dataclass(frozen=True)
class StepResult:
    loss_sum: torch.Tensor  # this rank's summed loss, on the device
    units: int
    grad_norm: torch.Tensor  # the same on every rank
    lr: float  # what the step used


@dataclass
class TrainingParts:
    """Everything one worker trains with; ``state`` is what a checkpoint saves and restores."""

    task: Task
    dataset: Samples
    model: torch.nn.Module
    flops_per_unit: float | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: ElasticSampler
    progress: Progress
    state: dict
    step: _StepRunner


def build_parts(cfg: TrainConfig, env: WorkerEnv, init_weights: bool = True) -> TrainingParts:
    """``init_weights=False`` when a checkpoint will overwrite the weights and the optimizer state: they are then
    only allocated (random init of a large model is slow, and so is computing an optimizer state to discard)."""
    torch.manual_seed(cfg.seed)
    task = load_task(cfg)
    dataset = task.open_dataset()
    model, flops_per_unit = _materialized_model(cfg, task, env, init_weights)
    optimizer = build_optimizer(model, cfg.train)
    if not init_weights:
        allocate_state(optimizer)
    scheduler = build_scheduler(optimizer, cfg.train)
    sampler = ElasticSampler(len(dataset), cfg.train.global_batch_size, cfg.seed)
    progress = Progress()
    state = {"model": ModelOptimState(model, optimizer), "scheduler": scheduler, "sampler": sampler,
             "progress": progress, "rng": RngState(env.rank), **_task_state(task)}
    return TrainingParts(task=task, dataset=dataset, model=model, flops_per_unit=flops_per_unit, optimizer=optimizer,
                         scheduler=scheduler, sampler=sampler, progress=progress, state=state,
                         step=_StepRunner(cfg, task, model, optimizer, scheduler, env))


def _materialized_model(cfg: TrainConfig, task: Task, env: WorkerEnv,
                        init_weights: bool) -> tuple[torch.nn.Module, float | None]:
    """Declared on the meta device, allocated on the worker's device, initialised from the RNG (the same on every
    rank) or from pretrained weights, then wrapped for data parallelism."""
    with torch.device("meta"):
        model = task.build_model()
    flops_per_unit = task.flops_per_unit(model)
    units = task.shard_units(model)
    model.to_empty(device=env.device)
    task.on_materialized(model)
    pretrained_url = cfg.model.hf.pretrained if cfg.model.hf is not None else None
    pretrained = init_weights and pretrained_url is not None
    if init_weights and not pretrained:
        task.init_weights(model)
    if cfg.train.compile:
        for unit in units:
            unit.compile()
    model = parallelize(model, units, cfg.parallel, env.device, bf16=cfg.train.dtype == "bfloat16",
                        sync_init=init_weights and not pretrained)
    if pretrained:  # after sharding, so that each rank reads only the rows it holds
        read = task.load_pretrained(model)
        log.info("rank %d read %.1f MB of pretrained weights from %s", env.rank, read / 1e6, pretrained_url)
    return model, flops_per_unit


def _task_state(task: Task) -> dict:
    """DCP calls ``state_dict``/``load_state_dict`` only on the top-level entries: each extra one is its own."""
    return {f"task.{name}": stateful for name, stateful in task.extra_state().items()}


def train(cfg: TrainConfig, env: WorkerEnv) -> dict:
    """Train to ``cfg.train.max_steps``, resuming from the newest committed checkpoint. Returns final metrics."""
    entered_at = time.time()
    root = run_root(cfg)
    attempt_id = shared_attempt_id()
    checkpointer = Checkpointer(root, rank=env.rank, world_size=env.world_size, keep_last=cfg.checkpoint.keep_last,
                                keep_best=cfg.checkpoint.keep_best, async_save=cfg.checkpoint.async_save,
                                failure_budget_s=cfg.checkpoint.save_failure_budget_s,
                                max_retry_gap=nominal_every_steps(cfg.checkpoint.every_steps), attempt_id=attempt_id)
    snapshots = (Snapshots(env.snapshot_root, rank=env.rank, world_size=env.world_size, attempt_id=attempt_id)
                 if env.snapshot_root is not None else None)
    candidates = checkpointer.committed()
    snapshot = snapshots.as_new_as(candidates[0].step if candidates else 0) if snapshots else None
    prefetch = RestorePrefetch(candidates[0]) if candidates and snapshot is None else None  # downloads meanwhile
    compile_cache = CompileCache(root, cfg, env) if cfg.train.compile else None
    if compile_cache is not None:
        compile_cache.load()
    parts = build_parts(cfg, env, init_weights=not candidates and snapshot is None)
    if env.rank == 0:
        _record_model(cfg, root, parts)
    restore_started = time.time()
    parts, restored = _restore(cfg, env, parts, checkpointer, snapshots, snapshot, candidates, prefetch)
    restore_s = time.time() - restore_started
    _seed_after_restore(cfg, env, parts.progress.step, restored)
    records = open_records(cfg, env, root, attempt_id, parts.progress.step)
    # A save holds only steps whose records are in storage: were they lost with a node, the run resumed from it would
    # keep steps its ledger does not have.
    for store in (checkpointer, snapshots):
        if store is not None:
            store.records_first = records.writer.check_written
    telemetry = _telemetry(cfg, env, records, entered_at, parts)
    from_snapshot = snapshot is not None and restored == snapshot
    telemetry.started(restore_started - entered_at, restore_s, from_snapshot=from_snapshot)
    try:
        return _StepLoop(cfg, env, parts, checkpointer, records, telemetry, snapshots, compile_cache).run()
    except (MovedOnNotice, GrowingBack) as ended:
        checkpointer.close()
        if snapshots is not None:
            snapshots.close()
        records.writer.close(timeout_s=30)
        if isinstance(ended, GrowingBack):
            raise
        return {"ended_to_restart": type(ended).__name__, "final_step": ended.args[0]}
    except (torch.OutOfMemoryError, MemoryError):
        log.exception("rank %d ran out of memory", env.rank)
        error = OutOfMemory(f"rank {env.rank} ran out of memory ({memory.describe(memory.this_rank(env.device))}): "
                            "lower train.micro_batch_size or train.seq_len, or use parallel: fsdp")
        _record_failure(telemetry, records.writer, error)
        raise error from None
    except Exception as exc:  # not SystemExit/KeyboardInterrupt: that is Ray stopping a surviving worker
        _record_failure(telemetry, records.writer, exc)
        _abandon(checkpointer, snapshots, records.writer)
        raise


FAILURE_RECORD_WAIT_S = 10.0


def _restore(cfg: TrainConfig, env: WorkerEnv, parts: TrainingParts, checkpointer: Checkpointer,
             snapshots: Snapshots | None, snapshot: CommittedCheckpoint | None,
             candidates: list[CommittedCheckpoint], prefetch: RestorePrefetch | None
             ) -> tuple[TrainingParts, CommittedCheckpoint | None]:
    """The newest state of the run's lineage into ``parts``: ``snapshot`` (as new as every checkpoint) where it
    reads back whole, else the newest committed checkpoint that does. Returns the parts and what they hold."""
    if snapshots is not None and snapshot is not None:
        if snapshots.restore(snapshot, parts.state, per_rank_keys=("rng",)):
            checkpointer.start_lineage(snapshot.step, [])
            return parts, snapshot
        if not candidates:  # the weights were left to the snapshot, which may have written some of them
            parts = build_parts(cfg, env)
    return parts, checkpointer.restore_latest(parts.state, per_rank_keys=("rng",), prefetch=prefetch,
                                              candidates=candidates)


def _abandon(checkpointer: Checkpointer, snapshots: Snapshots | None, writer: ledger.RecordWriter) -> None:
    """A failed attempt's saves are left to fail with its process group and its records end in the background: a
    survivor (``spotray.survivors``) trains on in this process, and must neither wait for them nor keep their
    threads."""
    checkpointer.abandon()
    if snapshots is not None:
        snapshots.abandon()
    threading.Thread(target=writer.close, kwargs={"timeout_s": FAILURE_RECORD_WAIT_S}, daemon=True,
                     name="close-failed-records").start()


def _record_failure(telemetry: Telemetry, writer: ledger.RecordWriter, exc: BaseException) -> None:
    """Why the attempt ended, written before the worker goes (Ray may tear its process down right after)."""
    telemetry.failed(exc)
    writer.flush(timeout_s=FAILURE_RECORD_WAIT_S)


def _record_model(cfg: TrainConfig, root: Location, parts: TrainingParts) -> None:
    spec = parts.task.export_spec()
    record = {"task": cfg.model.task or cfg.model.kind, "hf_config": spec.hf_config if spec else None,
              "hf_generation_config": spec.generation_config if spec else None,
              "rename": spec.rename if spec else None, "tokenizer": getattr(parts.dataset, "tokenizer", None)}
    write_model_record(root, record, getattr(parts.dataset, "tokenizer_files", {}))


def _seed_after_restore(cfg: TrainConfig, env: WorkerEnv, step: int, restored: CommittedCheckpoint | None) -> None:
    """A checkpoint of the same world size restored every rank's RNG; otherwise each rank seeds its own."""
    if restored is None:
        torch.manual_seed(cfg.seed + env.rank)
    elif restored.world_size != env.world_size:
        torch.manual_seed(cfg.seed + 1_000_003 * step + env.rank)
        log.info("resumed step %d saved by %d workers on %d: RNG reseeded", step, restored.world_size,
                 env.world_size)
    if env.rank == 0:
        log.info("%s at step %d (%s)", "resumed" if restored else "starting", step,
                 restored.url if restored else "no checkpoint")


def _telemetry(cfg: TrainConfig, env: WorkerEnv, records: Records, entered_at: float,
               parts: TrainingParts) -> Telemetry:
    if env.rank != 0:
        return Telemetry()
    return RankZeroTelemetry(
        attempts_root=records.root, attempt=records.attempt, entered_at=entered_at, max_steps=cfg.train.max_steps,
        tokens_per_step=units_per_step(cfg, parts.task), flops_per_token=parts.flops_per_unit,
        peak=peak_flops(cfg.train.peak_tflops, env.device), run_name=cfg.run.name, writer=records.writer,
        log_every=cfg.train.log_every)


class _StepLoop:
    """One attempt's steps, and what happens at three cadences: a log line, a checkpoint, a preemption check."""

    def __init__(self, cfg: TrainConfig, env: WorkerEnv, parts: TrainingParts, checkpointer: Checkpointer,
                 records: Records, telemetry: Telemetry, snapshots: Snapshots | None = None,
                 compile_cache: CompileCache | None = None):
        self.cfg, self.env, self.parts = cfg, env, parts
        self.checkpointer, self.records, self.telemetry = checkpointer, records, telemetry
        self.snapshots, self.compile_cache = snapshots, compile_cache
        self.compile_timer = CompileTimer() if cfg.train.compile else None
        self.snapshot_interval = SnapshotInterval(cfg.snapshot.every_steps, cfg.fault_tolerance.interruptions_per_hour,
                                                  parts.progress.step)
        self.snapshot_slowdown = SnapshotSlowdown()
        self.last_step = cfg.train.stop_at_step or cfg.train.max_steps
        self.tokens_per_step = units_per_step(cfg, parts.task)
        self.prefetch = _Prefetcher(parts.dataset)
        self.pending_losses: list[tuple[int, StepResult, float]] = []
        self.timed_steps, self.timed_seconds, self.last_step_s = 0, 0.0, 0.0
        self.cadence = Cadence(cfg, self.last_step, parts.progress.step, env.device, env.preemption_deadline)
        self.evaluator = (Evaluator(cfg, parts.task, open_val_dataset(parts.task), env.rank, env.world_size,
                                    env.device) if cfg.evaluates else None)
        self.val_losses: dict[int, float | None] = {}  # this attempt's evaluations, for the checkpoints' commit markers
        self.grow_back = (GrowBack(env.whole_group_fits, functools.partial(rank0_decides, device=env.device), env.rank,
                                    cfg.scaling.grow_after_s)
                          if env.world_size < cfg.scaling.num_workers else None)

    def run(self) -> dict:
        # What the process holds before its first step (Ray, torch, the model) stays out of the collector's full
        # passes: one over a Ray worker's ~400k objects stalls a step ~0.3 s, and every rank waits for the one that
        # stalls. Unfrozen at the end, so that a survivor's next generation can collect this one's cycles.
        gc.freeze()
        try:
            with self.compile_timer or contextlib.nullcontext():
                return self._run()
        finally:
            gc.unfreeze()

    def _run(self) -> dict:
        cfg = self.cfg
        while self.parts.progress.step < self.last_step:
            step = self._train_step()
            if self.compile_cache is not None:
                self.compile_cache.keep()
            if step % cfg.train.log_every == 0 or step == self.last_step:
                self._log(step)
            saving = self.cadence.save_due(step, self.checkpointer.retry_due(step))
            if self._eval_due(step, saving):
                self._evaluate(step)
            snapshotting = self._snapshot_due(step, at_checkpoint_interval=self.cadence.interval.due(step))
            if saving:
                self._checkpoint(step)
            if snapshotting:
                self._snapshot(step)
            if (saving or snapshotting) and self.grow_back is not None and self.grow_back.due():
                self._grow_back(step, self.checkpointer if saving else self.snapshots)
            self._check_preemption(step)
        self._commit_final()
        return self._finish()

    def _eval_due(self, step: int, saving: bool) -> bool:
        """At eval.every_steps, at the run's last step, and with checkpoint.keep_best at every checkpoint."""
        every = self.cfg.eval.every_steps
        return self.evaluator is not None and (every is not None and step % every == 0
                                               or step == self.cfg.train.max_steps
                                               or saving and self.cfg.checkpoint.keep_best)

    def _evaluate(self, step: int) -> None:
        assert self.evaluator is not None  # _eval_due
        started = time.perf_counter()
        metrics = self.evaluator(self.parts.model)
        self.val_losses[step] = metrics.get("val_loss")
        self.telemetry.evaluated(step, metrics, time.perf_counter() - started - self._compiled())

    def _compiled(self) -> float:
        return set_apart(self.compile_timer, self.telemetry)

    def _train_step(self) -> int:
        parts, env = self.parts, self.env
        copying = self.snapshots is not None and self.snapshots.writing
        writing = self.checkpointer.writing
        started = time.perf_counter()
        ids = parts.sampler.next_batch(env.rank, env.world_size)
        upcoming = parts.sampler.rank_slice(parts.sampler.consumed, env.rank, env.world_size)
        batch = self.prefetch.get(ids, upcoming if parts.progress.step + 1 < self.last_step else None)
        result = parts.step(batch)
        seconds = self.last_step_s = time.perf_counter() - started - self._compiled()
        parts.progress.step += 1
        step = parts.progress.step
        self.pending_losses.append((step, result, seconds))
        self.telemetry.step_done(seconds)
        if self.records.audit:
            self.records.audit.record(ids)
        if step > 1:  # the first step warms up kernels and allocators
            self.timed_steps, self.timed_seconds = self.timed_steps + 1, self.timed_seconds + seconds
            self.snapshot_slowdown.step(seconds, copying, writing)
        return step

    def _flush_logs(self) -> None:
        """Queue the records (a save that starts next writes once they are in storage: ``records_first``)."""
        records = self.records
        _reduce_losses(self.pending_losses, self.tokens_per_step, records.losses)
        self.pending_losses.clear()
        if self.env.rank == 0:
            records.losses.flush()
        if records.audit:
            records.audit.flush()

    def _log(self, step: int) -> None:
        self._flush_logs()  # also the record of how far this attempt got, should it die before its next save
        loss = self.records.losses.losses[step]
        assert loss is not None  # _reduce_losses recorded it
        self.telemetry.logged(step, loss, float(self.parts.scheduler.get_last_lr()[0]),
                              self.checkpointer.failed_saves, self.checkpointer.last_committed,
                              memory.all_ranks(self.env.device))

    def _checkpoint(self, step: int) -> None:
        self._flush_logs()
        started = time.perf_counter()
        committed = self.checkpointer.save(step, self.parts.state, val_loss=self.val_losses.get(step))
        blocked = time.perf_counter() - started
        self.telemetry.checkpoint(blocked, self.checkpointer.last_save_s)
        self.cadence.saved(step, blocked, self.checkpointer.last_save_s or blocked, self._mean_step_s())
        if committed:
            self.env.report({"step": committed.step})

    def _snapshot_due(self, step: int, at_checkpoint_interval: bool) -> bool:
        """A failed save's retry takes no snapshot with it: those come a step or two apart in an outage."""
        return (self.snapshots is not None and self.snapshots.off is None and step < self.last_step
                and self.snapshot_interval.due(step, at_checkpoint_interval, self.cadence.interval.steps))

    def _snapshot(self, step: int) -> None:
        assert self.snapshots is not None  # _snapshot_due
        self._flush_logs()
        started = time.perf_counter()
        previous = self.snapshots.save(step, self.parts.state)  # the one before, committed (or None)
        blocked = time.perf_counter() - started
        held = (previous.step, self.snapshots.usage()) if previous is not None and self.env.rank == 0 else None
        self.telemetry.snapshot(blocked, held)
        # What it costs: its blocking part, and the steps the last one's copy slowed (this one's is not over yet).
        slowed, alone = self.snapshot_slowdown.take()
        step_s = self._mean_step_s()
        cost = snapshot_cost_s(blocked, slowed, step_s, copy_timed=previous is not None)
        # The slowest rank's figures; timed alone only where the copy was on every rank.
        measured = [cost, self.snapshots.last_save_s or blocked, step_s, float(previous is None or not alone)]
        if self.snapshot_interval.auto:
            measured = slowest_rank(tuple(measured), self.env.device)
        cost, whole_s, step_s, not_alone = measured
        self.snapshot_interval.taken(step, cost, whole_s, step_s, alone=not not_alone)

    def _grow_back(self, step: int, store: Checkpointer | None) -> None:
        """Ends the attempt once ``step`` (just saved to ``store``) is committed: the whole group restarts from it
        and loses no step. A save that fails leaves it to the next committed step."""
        assert store is not None  # a snapshot was taken
        if store.ensure_saved(step, self.parts.state) is None:
            return
        self.telemetry.grew(step, time.time())
        if self.env.rank == 0:
            log.info("room for more workers: step %d is committed, going on with them", step)
        raise GrowingBack(step)

    def _mean_step_s(self) -> float:
        return self.timed_seconds / self.timed_steps if self.timed_steps else self.last_step_s

    def _check_preemption(self, step: int) -> None:
        deadline = self.cadence.notice(step, self._mean_step_s())
        if deadline is not None:
            self._flush_logs()
            if _survive_preemption(deadline, step, self._emergency_stores(), self.parts.state, self.env,
                                   self.telemetry, self.cfg.fault_tolerance.move_on_notice):
                raise MovedOnNotice(step)

    def _emergency_stores(self) -> tuple[Checkpointer, ...]:
        """Where a notice's step is kept, in the order tried: a snapshot, held on the nodes that stay (each part
        also on the next node), where snapshots are on, so that the attempt need not wait for storage; a
        checkpoint."""
        snapshots = self.snapshots
        return ((snapshots, self.checkpointer) if snapshots is not None and snapshots.off is None
                else (self.checkpointer,))

    def _commit_final(self) -> None:
        self._flush_logs()
        started = time.perf_counter()
        step = self.parts.progress.step
        committed = self.checkpointer.commit_final(step, self.parts.state, self.val_losses.get(step))
        self.telemetry.checkpoint(time.perf_counter() - started, self.checkpointer.last_save_s)
        self.checkpointer.close()
        if self.snapshots is not None:
            self.snapshots.close()
        self.env.report({"step": committed.step})

    def _finish(self) -> dict:
        """The run's final metrics, recorded in the ledger by rank 0 and reported to Ray."""
        parts, records = self.parts, self.records
        final = {
            "final_step": parts.progress.step,
            "final_loss": records.losses.losses.get(parts.progress.step),
            "samples_consumed": parts.sampler.consumed,
            "param_sha256": param_sha256(parts.model),
            "tokens_per_s": (self.timed_steps * self.tokens_per_step / self.timed_seconds if self.timed_seconds
                             else None),
            "attempt_id": records.attempt.attempt_id,
            "failed_saves": self.checkpointer.failed_saves,
            **({"graphs_from_compile_cache": self.compile_cache.graphs_from_cache()} if self.compile_cache else {}),
        }
        self.telemetry.finished()
        records.writer.close(timeout_s=max(60.0, self.cfg.checkpoint.save_failure_budget_s))
        if self.env.rank == 0:
            ledger.write_final(records.root, records.attempt.attempt_id, final)
        self.env.report(final)
        return final


def _survive_preemption(deadline: float, step: int, stores: tuple[Checkpointer, ...], state: dict, env: WorkerEnv,
                        telemetry: Telemetry, move_on: bool = True) -> bool:
    """A drain with a deadline was announced: commit the current step to the first of ``stores`` that takes it in
    time (the snapshots' memory, storage), then (``move_on``) end the attempt as soon as the worker group fits on
    other nodes (True), or else stop making progress until the node goes, so that no step is lost.
    If the deadline is too short for a save, fall back to the last checkpoint (False: training goes on)."""
    noticed_at = time.time()
    committed, kind = None, "checkpoint"
    for store in stores:
        kind = "snapshot" if isinstance(store, Snapshots) else "checkpoint"
        store.wait()  # a save in flight runs collectives on the group that agree uses, in the background
        if too_short(deadline, store.last_save_s, store.agree):
            continue
        started = time.monotonic()
        committed = store.ensure_saved(step, state)
        if kind == "snapshot":
            telemetry.snapshot(time.monotonic() - started, None)
        else:
            telemetry.checkpoint(time.monotonic() - started, store.last_save_s)
        if committed is not None:
            break
    telemetry.notice(step, noticed_at, committed=committed is not None, kept_in=kind)
    if committed is None:
        log.warning("preemption notice: no emergency checkpoint of step %d; continuing, a restart resumes from the "
                    "last committed checkpoint", step)
        return False
    env.report({"step": step, "emergency": True})
    if env.rank == 0:
        log.info("preemption notice: emergency %s of step %d committed, %.1fs before the deadline", kind, step,
                 deadline - time.time())
    return move_or_wait(deadline, step, store.agree, env.rank, env.capacity_elsewhere, telemetry, move_on)


def units_per_step(cfg: TrainConfig, task: Task) -> int:
    """The loss denominator of every step (tokens for a language model), over all ranks."""
    return cfg.train.global_batch_size * task.units_per_sample


def _reduce_losses(pending: list[tuple[int, StepResult, float]], per_step: int, losses: ledger.LossLog) -> None:
    """One all-reduce for a window of steps: per-step mean loss over the global batch, and the task's unit count,
    which must be the constant denominator the gradients were scaled by."""
    if not pending:
        return
    sums = torch.stack([result.loss_sum.double() for _, result, _ in pending])
    counts = torch.tensor([result.units for _, result, _ in pending], dtype=torch.float64, device=sums.device)
    norms = torch.stack([result.grad_norm.double() for _, result, _ in pending]).tolist()
    totals = torch.stack([sums, counts])
    if dist.is_initialized():
        dist.all_reduce(totals)
    for (step, result, seconds), total, units, norm in zip(pending, *totals.tolist(), norms, strict=True):
        if units != per_step:
            raise TaskError(f"the task's loss counted {units:.0f} units at step {step}, not the {per_step} of "
                            "train.global_batch_size x units_per_sample: the loss denominator must be constant "
                            "(docs/own-model.md)")
        value = total / per_step
        if not math.isfinite(value):
            raise FloatingPointError(f"loss is {value} at step {step}: lower train.lr or check the data")
        losses.record(step, value, seconds, result.lr, norm, tokens=per_step)
