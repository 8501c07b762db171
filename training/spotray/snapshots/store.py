"""In-memory snapshots: checkpoints (the same DCP files, commit marker and checksums, so the same rule that a
partial or damaged one is never restored) whose store is the holders' memory on the run's nodes instead of storage.
They are taken in the background between checkpoints and with them; after a kill the next attempt restores the newest
one unless a committed checkpoint is newer, reading nothing from storage."""

from __future__ import annotations

import logging

from spotray.accounts.ledger import RecordsUnwritten
from spotray.checkpoints.dcp import Checkpointer, CommittedCheckpoint, all_gather_objects, first_line, only_caused_by
from spotray.snapshots.memfs import holder_ring, holder_usage
from spotray.storage import Location

log = logging.getLogger(__name__)


class Snapshots(Checkpointer):
    """The run's snapshots for one attempt (every rank has one): the newest is kept, each saved asynchronously. In a
    storage outage each is skipped; a node without room for one is left out of the ring; a snapshot that fails
    otherwise turns them off for the attempt. Each with one warning: checkpoints go on as before."""

    warns_of_partial = False  # a kill mid-copy leaves one: expected, and gone with the next snapshot
    noun = "snapshot"

    def __init__(self, root: Location, *, rank: int, world_size: int, attempt_id: str):
        super().__init__(root, rank=rank, world_size=world_size, keep_last=1, async_save=True, attempt_id=attempt_id)
        self.off: str | None = None  # why snapshots are off for this attempt
        self.skipping = False  # storage is out, so the records of a snapshot's steps cannot be written first

    def save(self, step: int, state: dict, blocking: bool = False,
             val_loss: float | None = None) -> CommittedCheckpoint | None:
        """Starts the snapshot of ``step`` in the background, unless the one before it failed; returns that one
        where it committed. ``blocking``: returns this one once committed; None where it failed or snapshots are
        off."""
        previous = self.wait()
        if self.off is not None:
            return None if blocking else previous
        saved = super().save(step, state, blocking=blocking, val_loss=val_loss)
        return saved if blocking else previous

    def _succeeded(self, step: int) -> CommittedCheckpoint:
        self.skipping = False
        return super()._succeeded(step)

    def _failed(self, step: int, exc: BaseException) -> None:
        """Every rank sees the failure at once (DCP's rule), so they agree here: a storage outage skips the snapshot
        (one warning until one commits again); nodes that ran out of room hold no snapshots from now on where others
        still can; otherwise snapshots are off for the attempt."""
        self._discard(step)
        if only_caused_by(exc, RecordsUnwritten):
            if self.rank == 0 and not self.skipping:
                log.warning("the snapshot of step %d is skipped (%s): snapshots go on, each skipped until storage is "
                            "back", step, first_line(exc))
            self.skipping = True
            return
        ring = holder_ring(self.root)
        full = set().union(*all_gather_objects(sorted(ring.refused), self.group)) if ring else set()
        if full and ring is not None and ring.exclude(full):
            if self.rank == 0:
                log.warning("node %s has no room for the snapshot of step %d (%s): it holds no snapshots from now "
                            "on; its ranks' parts go to the next nodes", ", ".join(sorted(full)), step,
                            first_line(exc))
            return
        self.off = f"the snapshot of step {step} failed ({first_line(exc)})"
        if self.rank == 0:
            log.warning("%s: snapshots are off for this attempt; checkpoints go on", self.off)

    def usage(self) -> dict[str, tuple[int, int]]:
        """Each node's bytes held for the run's snapshots, and the most it may hold."""
        return holder_usage(self.root)

    def as_new_as(self, step: int) -> CommittedCheckpoint | None:
        """The newest committed snapshot at ``step`` (the newest checkpoint's) or later: the one a restore takes. At
        the checkpoint's own step it holds the same state, and reads nothing from storage."""
        newest = self.committed()[:1]
        return newest[0] if newest and newest[0].step >= step and newest[0].damage is None else None

    def restore(self, snapshot: CommittedCheckpoint, state: dict, per_rank_keys: tuple[str, ...]) -> bool:
        """Loads ``snapshot`` into ``state``; False where it cannot be read whole (a node holding both copies of a
        part is gone, or a checksum fails): then it is dropped and the caller restores from storage."""
        try:
            reason = self._load(snapshot, state, per_rank_keys, prefetch=None)
        except Exception as exc:  # an unexpected failure is no reason to stop: storage still has the run
            reason = first_line(exc)
        if reason is None:
            self.last_committed = snapshot
            return True
        if self.rank == 0:
            log.warning("the snapshot of step %d cannot be restored (%s): restoring from storage instead",
                        snapshot.step, reason)
            snapshot.location.delete_tree()
        return False
