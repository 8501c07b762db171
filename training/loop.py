"""The training loop, independent of the launcher (Ray Train or a bare process group)."""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from training import ledger
from training.checkpoint import Checkpointer, RestorePrefetch, RngState
from training.config import TrainConfig
from training.data.dataset import TokenDataset
from training.model import GPT, GPTShape
from training.optim import allocate_state, build_optimizer, build_scheduler
from training.parallel import gradient_sync, parallelize
from training.sampler import ElasticSampler
from training.storage import Location, resolve
from training.telemetry import Telemetry, peak_flops

log = logging.getLogger(__name__)

Reporter = Callable[[dict], None]


def _no_preemption() -> float | None:
    return None


@dataclass(frozen=True)
class WorkerEnv:
    rank: int
    world_size: int
    device: torch.device
    report: Reporter
    # UNIX time by which this worker group will be preempted, or None. A collective: every rank calls it alike.
    preemption_deadline: Callable[[], float | None] = _no_preemption


def run_root(cfg: TrainConfig) -> Location:
    return resolve(cfg.checkpoint.path, cfg.storage.options()).child(cfg.run.name)


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

    def __init__(self, dataset: TokenDataset):
        self.dataset = dataset
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending = None

    def get(self, ids: list[int], next_ids: list[int] | None) -> torch.Tensor:
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
        digest.update(full[key].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class _StepRunner:
    """One optimizer step over a per-rank batch, split into micro-batches with gradient accumulation."""

    def __init__(self, cfg: TrainConfig, model, optimizer, scheduler, env: WorkerEnv):
        self.model, self.optimizer, self.scheduler, self.env = model, optimizer, scheduler, env
        self.micro = cfg.train.micro_batch_size or cfg.per_worker_batch
        self.clip = cfg.train.grad_clip
        self.bf16 = cfg.train.dtype == "bfloat16"
        # Each rank's sum of token losses is scaled so that the data-parallel gradient average equals the
        # gradient of the mean loss over the whole global batch, whatever the world size.
        self.scale = env.world_size / (cfg.train.global_batch_size * cfg.train.seq_len)

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        batch = batch.to(self.env.device, non_blocking=True)
        chunks = batch.split(self.micro)
        loss_sum = torch.zeros((), device=self.env.device)
        for i, chunk in enumerate(chunks):
            with gradient_sync(self.model, enabled=i == len(chunks) - 1):
                with torch.autocast(self.env.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                    logits = self.model(chunk[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
                (loss * self.scale).backward()
            loss_sum += loss.detach()
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return loss_sum


@dataclass
class Training:
    """Everything one worker trains with; ``state`` is what a checkpoint saves and restores."""

    dataset: TokenDataset
    shape: GPTShape
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: ElasticSampler
    progress: Progress
    state: dict
    step: _StepRunner


def build_training(cfg: TrainConfig, env: WorkerEnv, init_weights: bool = True) -> Training:
    """``init_weights=False`` when a checkpoint will overwrite the weights and the optimizer state: they are then
    only allocated (random init of a large model is slow, and so is computing an optimizer state to discard)."""
    torch.manual_seed(cfg.seed)
    dataset = TokenDataset.open(cfg.data.path, cfg.train.seq_len, cfg.storage.options())
    shape = GPTShape.from_config(cfg.model, dataset.vocab_size, cfg.train.seq_len)
    with torch.device("meta"):
        model = GPT(shape)
    model.to_empty(device=env.device)
    if init_weights:
        model.init_weights()
    if cfg.train.compile:
        for block in model.blocks:
            block.compile()
    model = parallelize(model, cfg.parallel, env.device, bf16=cfg.train.dtype == "bfloat16", sync_init=init_weights)
    optimizer = build_optimizer(model, cfg.train)
    if not init_weights:
        allocate_state(optimizer)
    scheduler = build_scheduler(optimizer, cfg.train)
    sampler = ElasticSampler(len(dataset), cfg.train.global_batch_size, cfg.seed)
    progress = Progress()
    state = {"model": ModelOptimState(model, optimizer), "scheduler": scheduler, "sampler": sampler,
             "progress": progress, "rng": RngState(env.rank)}
    step = _StepRunner(cfg, model, optimizer, scheduler, env)
    return Training(dataset, shape, model, optimizer, scheduler, sampler, progress, state, step)


def train(cfg: TrainConfig, env: WorkerEnv) -> dict:
    """Train to ``cfg.train.max_steps``, resuming from the newest committed checkpoint. Returns final metrics."""
    entered_at = time.time()
    root = run_root(cfg)
    checkpointer = Checkpointer(root, cfg.checkpoint.keep_last, cfg.checkpoint.async_save, env.rank, env.world_size,
                                cfg.checkpoint.save_failure_budget_s, max_retry_gap=cfg.checkpoint.every_steps)
    candidates = checkpointer.committed()
    prefetch = RestorePrefetch(candidates[0]) if candidates else None  # downloads while the model is built
    t = build_training(cfg, env, init_weights=not candidates)
    progress, state = t.progress, t.state
    options = cfg.storage.options()
    restore_started = time.time()
    restored = checkpointer.restore_latest(state, per_rank_keys=("rng",), prefetch=prefetch, candidates=candidates)
    restore_s = time.time() - restore_started
    if restored is None:
        torch.manual_seed(cfg.seed + env.rank)
    elif restored.world_size != env.world_size:
        torch.manual_seed(cfg.seed + 1_000_003 * progress.step + env.rank)
        log.info("resumed step %d saved by %d workers on %d: RNG reseeded", progress.step, restored.world_size,
                 env.world_size)
    if env.rank == 0:
        log.info("%s at step %d (%s)", "resumed" if restored else "starting", progress.step,
                 restored.url if restored else "no checkpoint")

    attempt = ledger.AttemptInfo(_shared_attempt_id(), progress.step, env.world_size, cfg.per_worker_batch)
    attempts_root = root.child("attempts")
    records = ledger.RecordWriter()
    losses = ledger.LossLog(attempts_root, attempt.attempt_id, records)
    audit = None
    if cfg.audit_dir:
        audit_root = resolve(cfg.audit_dir, options)
        audit = ledger.AuditLog(audit_root, attempt.attempt_id, env.rank, records)
        if env.rank == 0:
            ledger.write_attempt(audit_root, attempt)
    if env.rank == 0:
        ledger.write_attempt(attempts_root, attempt)
    last_step = cfg.train.stop_at_step or cfg.train.max_steps
    tokens_per_step = cfg.train.global_batch_size * cfg.train.seq_len
    telemetry = Telemetry(env.rank == 0, attempts_root, attempt, entered_at, cfg.train.max_steps, tokens_per_step,
                          t.shape.flops_per_token(), peak_flops(cfg.train.peak_tflops, env.device), cfg.run.name,
                          records)
    telemetry.started(restore_started - entered_at, restore_s)
    try:
        return _train_steps(cfg, env, t, checkpointer, _Records(attempt, attempts_root, records, losses, audit),
                            telemetry, last_step)
    except Exception as exc:  # not SystemExit/KeyboardInterrupt: that is Ray stopping a surviving worker
        telemetry.failed(exc)
        raise


@dataclass(frozen=True)
class _Records:
    """This attempt's ledger entries."""

    attempt: ledger.AttemptInfo
    root: Location
    writer: ledger.RecordWriter
    losses: ledger.LossLog
    audit: ledger.AuditLog | None


def _train_steps(cfg: TrainConfig, env: WorkerEnv, t: Training, checkpointer: Checkpointer, records: _Records,
                 telemetry: Telemetry, last_step: int) -> dict:
    sampler, progress, state = t.sampler, t.progress, t.state
    losses, audit = records.losses, records.audit
    prefetch = _Prefetcher(t.dataset)
    pending_losses: list[tuple[int, torch.Tensor, float]] = []
    tokens_per_step = cfg.train.global_batch_size * cfg.train.seq_len
    timed_steps, timed_seconds = 0, 0.0

    def flush_logs(durable: bool = False) -> None:
        """Queue the records; ``durable`` (before a checkpoint) waits for them unless storage is failing."""
        _reduce_losses(pending_losses, tokens_per_step, losses)
        pending_losses.clear()
        if env.rank == 0:
            losses.flush()
        if audit:
            audit.flush()
        if durable:
            records.writer.flush()

    def save(blocking: bool = False) -> None:
        started = time.perf_counter()
        committed = checkpointer.save(progress.step, state, blocking=blocking)
        telemetry.checkpoint(time.perf_counter() - started, checkpointer.last_save_s)
        if committed:
            env.report({"step": committed.step})

    while progress.step < last_step:
        started = time.perf_counter()
        ids = sampler.next_batch(env.rank, env.world_size)
        upcoming = sampler.rank_slice(sampler.consumed, env.rank, env.world_size)
        batch = prefetch.get(ids, upcoming if progress.step + 1 < last_step else None)
        loss = t.step(batch)
        seconds = time.perf_counter() - started
        progress.step += 1
        pending_losses.append((progress.step, loss, seconds))
        telemetry.step_done(seconds)
        if audit:
            audit.record(ids)
        step = progress.step
        if step > 1:
            timed_steps, timed_seconds = timed_steps + 1, timed_seconds + seconds
        if step % cfg.train.log_every == 0 or step == last_step:
            flush_logs()  # also the record of how far this attempt got, should it die before its next save
            telemetry.logged(step, losses.losses[step], t.scheduler.get_last_lr()[0], checkpointer.failed_saves,
                             checkpointer.last_committed)
        if step % cfg.checkpoint.every_steps == 0 or checkpointer.retry_due(step):
            flush_logs(durable=True)
            save()
        if step % cfg.fault_tolerance.preemption_check_every_steps == 0 and step < last_step:
            deadline = env.preemption_deadline()
            if deadline is not None:
                flush_logs(durable=True)
                _survive_preemption(deadline, step, checkpointer, state, env, telemetry)

    flush_logs(durable=True)
    started = time.perf_counter()
    committed = checkpointer.commit_final(progress.step, state)
    telemetry.checkpoint(time.perf_counter() - started, checkpointer.last_save_s)
    checkpointer.close()
    env.report({"step": committed.step})
    final = {
        "final_step": progress.step,
        "final_loss": losses.losses.get(progress.step),
        "samples_consumed": sampler.consumed,
        "param_sha256": param_sha256(t.model),
        "tokens_per_s": timed_steps * tokens_per_step / timed_seconds if timed_seconds else None,
        "attempt_id": records.attempt.attempt_id,
        "failed_saves": checkpointer.failed_saves,
    }
    telemetry.finished()
    records.writer.close(timeout_s=max(60.0, cfg.checkpoint.save_failure_budget_s))
    if env.rank == 0:
        ledger.write_final(records.root, records.attempt.attempt_id, final)
    env.report(final)
    return final


PREEMPTION_WAIT_GRACE_S = 30.0


def _survive_preemption(deadline: float, step: int, checkpointer: Checkpointer, state: dict, env: WorkerEnv,
                        telemetry: Telemetry) -> None:
    """A drain with a deadline was announced: commit the current step, then stop making progress until the node
    goes, so that no step is lost. If the deadline is too short for a save, fall back to the last checkpoint."""
    noticed_at = time.time()
    remaining = deadline - noticed_at
    estimate = checkpointer.last_save_s
    # Rank 0's estimate decides for all: the save is a collective, every rank must choose alike.
    too_short = checkpointer.agree(estimate is not None and remaining < 1.2 * estimate)
    if too_short:
        telemetry.notice(step, noticed_at, committed=False)
        log.warning("preemption in %.1fs is too short for a checkpoint (last save took %.1fs): continuing, "
                    "a restart resumes from the last committed checkpoint", remaining, estimate)
        return
    started = time.monotonic()
    committed = checkpointer.ensure_saved(step, state)
    telemetry.checkpoint(time.monotonic() - started, checkpointer.last_save_s)
    telemetry.notice(step, noticed_at, committed=committed is not None)
    if committed is None:
        log.warning("preemption notice: the emergency checkpoint of step %d failed; continuing, a restart resumes "
                    "from the last committed checkpoint", step)
        return
    env.report({"step": step, "emergency": True})
    if env.rank == 0:
        log.warning("preemption notice: emergency checkpoint of step %d committed in %.1fs, %.1fs before the "
                    "deadline; waiting for the node to go", step, time.monotonic() - started, deadline - time.time())
    waiting_since = time.monotonic()
    while time.time() < deadline + PREEMPTION_WAIT_GRACE_S:
        time.sleep(0.2)
    telemetry.drain_wait(time.monotonic() - waiting_since)
    log.warning("the announced preemption did not happen: continuing to train")


def _reduce_losses(pending: list[tuple[int, torch.Tensor, float]], tokens_per_step: int,
                   losses: ledger.LossLog) -> None:
    """One all-reduce for a window of steps: per-step mean token loss over the global batch."""
    if not pending:
        return
    stacked = torch.stack([loss for _, loss, _ in pending])
    if dist.is_initialized():
        dist.all_reduce(stacked)
    for (step, _, seconds), total in zip(pending, stacked.tolist(), strict=True):
        value = total / tokens_per_step
        if not math.isfinite(value):
            raise FloatingPointError(f"loss is {value} at step {step}: lower train.lr or check the data")
        losses.record(step, value, seconds)


def _shared_attempt_id() -> str:
    box = [ledger.new_attempt_id()]
    if dist.is_initialized():
        dist.broadcast_object_list(box, src=0)
    return box[0]
