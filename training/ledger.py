"""Per-attempt records in storage (loss log, audit of trained sample ids) and the run's lineage.

A run is a sequence of attempts (one per worker-group start). An attempt resumes from some committed step
and may train past the checkpoint the next attempt resumes from; those steps are wasted. The lineage keeps,
for every step, the record of the latest attempt that trained it: exactly the history of the final model.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from training.storage import Location

_ATTEMPT_FILE = "attempt.json"
_LOSSES_FILE = "losses.jsonl"
_FINAL_FILE = "final.json"


def new_attempt_id() -> str:
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:6]}"


@dataclass
class AttemptInfo:
    attempt_id: str
    from_step: int
    world_size: int
    per_rank_batch: int
    started_at: float = field(default_factory=time.time)


def write_attempt(root: Location, info: AttemptInfo) -> None:
    root.child(info.attempt_id, _ATTEMPT_FILE).write_text(json.dumps(info.__dict__, sort_keys=True))


def read_attempts(root: Location) -> list[AttemptInfo]:
    attempts = []
    for name in root.list_names():
        marker = root.child(name, _ATTEMPT_FILE)
        if marker.exists():
            attempts.append(AttemptInfo(**json.loads(marker.read_text())))
    return sorted(attempts, key=lambda a: a.attempt_id)


def write_final(root: Location, attempt_id: str, final: dict) -> None:
    root.child(attempt_id, _FINAL_FILE).write_text(json.dumps(final, sort_keys=True))


def read_final(root: Location) -> dict | None:
    """Final metrics of the newest attempt that finished the run."""
    for attempt in reversed(read_attempts(root)):
        final = root.child(attempt.attempt_id, _FINAL_FILE)
        if final.exists():
            return json.loads(final.read_text())
    return None


class LossLog:
    """Rank 0's per-step losses of one attempt, rewritten in full at each flush (small, atomic)."""

    def __init__(self, root: Location, attempt_id: str):
        self.location = root.child(attempt_id, _LOSSES_FILE)
        self.losses: dict[int, float] = {}

    def record(self, step: int, loss: float) -> None:
        self.losses[step] = loss

    def flush(self) -> None:
        lines = (json.dumps({"step": s, "loss": v}) for s, v in sorted(self.losses.items()))
        self.location.write_text("\n".join(lines) + "\n")


class AuditLog:
    """One rank's trained sample ids of one attempt, one id per line, in training order."""

    def __init__(self, root: Location, attempt_id: str, rank: int):
        self.location = root.child(attempt_id, f"rank-{rank:05d}.txt")
        self.ids: list[int] = []

    def record(self, ids: list[int]) -> None:
        self.ids.extend(ids)

    def flush(self) -> None:
        self.location.write_text("".join(f"{i}\n" for i in self.ids))


def lineage_losses(root: Location) -> dict[int, float]:
    """step -> loss of the final model's history."""
    losses: dict[int, float] = {}
    for attempt in read_attempts(root):
        log = root.child(attempt.attempt_id, _LOSSES_FILE)
        if log.exists():
            for line in log.read_text().splitlines():
                record = json.loads(line)
                losses[int(record["step"])] = float(record["loss"])
    return dict(sorted(losses.items()))


def lineage_sample_ids(audit_root: Location) -> dict[int, list[int]]:
    """step -> the sample ids trained at that step (all ranks, rank order), from the audit files."""
    per_step: dict[int, list[int]] = {}
    for attempt in read_attempts(audit_root):
        files = (audit_root.child(attempt.attempt_id, f"rank-{r:05d}.txt") for r in range(attempt.world_size))
        ranks = [_read_ids(f) for f in files]
        steps = min(len(ids) for ids in ranks) // attempt.per_rank_batch
        for k in range(steps):
            window = slice(k * attempt.per_rank_batch, (k + 1) * attempt.per_rank_batch)
            per_step[attempt.from_step + k + 1] = [i for ids in ranks for i in ids[window]]
    return dict(sorted(per_step.items()))


def _read_ids(location: Location) -> list[int]:
    return [int(x) for x in location.read_text().split()] if location.exists() else []


@dataclass(frozen=True)
class AuditResult:
    exactly_once: bool
    steps: int
    samples: int
    duplicates: int
    missing_steps: list[int]


def verify_exactly_once(audit_root: Location, num_samples: int, final_step: int) -> AuditResult:
    """Within each epoch every sample was trained at most once, and every step 1..final_step is accounted for."""
    per_step = lineage_sample_ids(audit_root)
    missing = [s for s in range(1, final_step + 1) if s not in per_step]
    ordered = [i for s in range(1, final_step + 1) for i in per_step.get(s, [])]
    duplicates = 0
    for start in range(0, len(ordered), num_samples):
        epoch = ordered[start : start + num_samples]
        duplicates += len(epoch) - len(set(epoch))
    return AuditResult(not missing and duplicates == 0, final_step, len(ordered), duplicates, missing)
