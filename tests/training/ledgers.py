"""Run ledgers written directly, without training: one attempt's records as rank 0 leaves them."""

from __future__ import annotations

import json

from spotray.accounts import goodput, ledger


def write_attempt(root, attempt_id: str, from_step: int, last_step: int, status: dict, world_size: int = 2,
                  configured_workers: int = 0) -> None:
    """Attempt ``attempt_id`` trained steps ``from_step+1 .. last_step`` (loss 10/step, 1 s each) on ``world_size``
    workers of ``configured_workers``; its status.json holds ``status`` as given."""
    info = ledger.AttemptInfo(attempt_id, from_step, world_size=world_size, per_rank_batch=8 // world_size,
                              started_at=status["entered_at"], configured_workers=configured_workers)
    ledger.write_attempt(root, info)
    writer = ledger.RecordWriter()
    losses = ledger.LossLog(root, attempt_id, writer)
    for step in range(from_step + 1, last_step + 1):
        losses.record(step, loss=10.0 / step, seconds=1.0)
    losses.flush()
    clock = goodput.AttemptClock(root, attempt_id, status["entered_at"], 100, writer)
    clock.update(**status)
    writer.put(clock.location, json.dumps(clock.status))  # flush() would stamp last_seen with now
    writer.close(timeout_s=10)
