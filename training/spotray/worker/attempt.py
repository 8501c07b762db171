"""An attempt on the workers, whatever runs it (spotray's loop or a user's script): what a worker is given
(``WorkerEnv``), where the run lives in storage (``run_root``), the attempt's id, and its records in the ledger."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from spotray.accounts import ledger
from spotray.accounts.node_records import this_node
from spotray.checkpoints.dcp import all_gather_objects
from spotray.config import TrainConfig
from spotray.storage import Location, resolve

Reporter = Callable[[dict], None]


def _no_preemption() -> float | None:
    return None


def _no_capacity() -> bool:
    return False


@dataclass(frozen=True)


class WorkerEnv:
    rank: int
    world_size: int
    device: torch.device
    report: Reporter
    # UNIX time by which this worker group will be preempted, or None. A collective: every rank calls it alike.
    preemption_deadline: Callable[[], float | None] = _no_preemption
    # Whether the worker group would fit on nodes that are not being preempted (asked by rank 0 after a notice).
    capacity_elsewhere: Callable[[], bool] = _no_capacity
    # Where this attempt keeps its in-memory snapshots (the holders on the run's nodes), or None: no snapshots.
    snapshot_root: Location | None = None
    # Whether the whole worker group (scaling.num_workers) would fit now, for a group below it (asked by rank 0).
    whole_group_fits: Callable[[], bool] = _no_capacity


def run_root(cfg: TrainConfig) -> Location:
    return resolve(cfg.checkpoint.path, cfg.storage.options()).child(cfg.run.name)


@dataclass(frozen=True)


class Records:
    """This attempt's ledger entries."""

    attempt: ledger.AttemptInfo
    root: Location
    writer: ledger.RecordWriter
    losses: ledger.LossLog
    audit: ledger.AuditLog | None


def open_records(cfg: TrainConfig, env: WorkerEnv, root: Location, attempt_id: str, from_step: int) -> Records:
    """The attempt's records; every rank names its node (a collective)."""
    attempt = ledger.AttemptInfo(attempt_id, from_step, env.world_size, cfg.per_worker_batch(env.world_size),
                                 nodes=all_gather_objects(this_node(), None),
                                 gpus_per_worker=cfg.scaling.worker_resources.get("GPU", 0),
                                 configured_workers=cfg.scaling.num_workers)
    attempts_root = root.child("attempts")
    writer = ledger.RecordWriter()
    audit = None
    if cfg.audit_dir:
        audit_root = resolve(cfg.audit_dir, cfg.storage.options())
        audit = ledger.AuditLog(audit_root, attempt.attempt_id, env.rank, writer)
        if env.rank == 0:
            ledger.write_attempt(audit_root, attempt)
    if env.rank == 0:
        ledger.write_attempt(attempts_root, attempt)
    return Records(attempt, attempts_root, writer, ledger.LossLog(attempts_root, attempt.attempt_id, writer), audit)


def shared_attempt_id() -> str:
    box = [ledger.new_attempt_id()]
    if dist.is_initialized():
        dist.broadcast_object_list(box, src=0)
    return box[0]
