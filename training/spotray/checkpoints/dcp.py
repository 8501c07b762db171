"""Sharded, committed, verifiable checkpoints with torch.distributed.checkpoint (DCP) on any storage URL.

Layout of a run (the only place that knows it)::

    <checkpoint.path>/<run.name>/checkpoints/step_000000040/
        .metadata  __0_0.distcp  __1_0.distcp  COMMITTED.json

Every rank writes its own shard straight to storage as raw tensor bytes (DCP's ``.metadata`` has the shapes
and each item's CRC32). The coordinator's ``finish`` runs only after all ranks have written; it writes
``COMMITTED.json`` (every file's size, the CRC32 of ``.metadata``) last, so a directory without it is a partial
save and is never resumed from. Reads verify sizes and checksums: a corrupted checkpoint fails to load on every
rank alike (DCP gathers per-rank errors) and the next older one is used.

The checkpoints under ``checkpoints/`` are one lineage: an attempt that resumes from step S moves the committed
checkpoints above S (which it could not read) to ``checkpoints/set-aside/`` before it trains, so that they never
count for retention, never hide the lineage's newest and are never overwritten by a later save of the same step.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import posixpath
import time
import warnings
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import (
    CURRENT_DCP_VERSION,
    FileSystemBase,
    FileSystemReader,
    _FileSystemWriter,
    _StorageInfo,
)
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.checkpoint.storage import WriteResult

from spotray.accounts.ledger import new_attempt_id
from spotray.checkpoints.save_retries import SaveFailureBudget
from spotray.errors import CheckpointError, NotFound, SpotrayError, StorageError, Unrestorable
from spotray.renames import renamed
from spotray.storage import Location

log = logging.getLogger(__name__)

COMMIT_MARKER = "COMMITTED.json"
SET_ASIDE_DIR = "set-aside"
SET_ASIDE_RECORD = "SET_ASIDE.json"
_FORMAT = "spotray-checkpoint"
FILES_FORMAT = "spotray-files"  # a user script's own files (``spotray.commit``): restored by the script, not by DCP
_DATA_SUFFIX = ".distcp"
METADATA = ".metadata"


@dataclass(frozen=True)
class CommittedCheckpoint:
    step: int
    location: Location
    world_size: int
    files: dict
    committed_at: float  # UNIX time of its commit marker
    damage: str | None = None  # why its commit marker cannot be read, for one listed with ``damaged=True``
    val_loss: float | None = None  # the validation loss of its step, where the run evaluated before saving it
    format: str = _FORMAT  # or FILES_FORMAT

    @property
    def is_files(self) -> bool:
        """A script's files (``spotray.commit``), not a DCP state dict."""
        return self.format == FILES_FORMAT

    @property
    def url(self) -> str:
        return self.location.url

    @property
    def nbytes(self) -> int:
        """Its size in storage, from the commit marker (no file is read or listed)."""
        return sum(int(f["size"]) for f in self.files.values())


def retained(lineage: list[CommittedCheckpoint], keep_last: int, keep_best: bool) -> list[CommittedCheckpoint]:
    """The one retention rule: the ``keep_last`` newest of a lineage (newest first), and with ``keep_best`` also
    its best one, extra to them."""
    kept = lineage[:keep_last]
    best = best_checkpoint(lineage) if keep_best else None
    return kept + [best] if best is not None and best not in kept else kept


def best_checkpoint(checkpoints: list[CommittedCheckpoint]) -> CommittedCheckpoint | None:
    """The checkpoint with the lowest validation loss (the older one of a tie); None where none was evaluated.
    An emergency checkpoint is never evaluated, so never the best."""
    evaluated = [c for c in checkpoints if c.val_loss is not None]
    return min(evaluated, key=lambda c: (c.val_loss, c.step)) if evaluated else None


def checkpoints_root(run_root: Location) -> Location:
    return run_root.child("checkpoints")


def set_aside_root(run_root: Location) -> Location:
    return checkpoints_root(run_root).child(SET_ASIDE_DIR)


def _step_dir_name(step: int) -> str:
    return f"step_{step:09d}"


class _DcpFileSystem(FileSystemBase):
    """DCP's filesystem seam over a storage Location, for reading: whole files, verified against the marker.

    Writes never come through here: ``_CommittingWriter`` writes shards and ``.metadata`` via the Location."""

    def __init__(self, root: Location, expected: dict | None = None, prefetched: dict[str, memoryview] | None = None):
        self.root = root
        self.expected = expected or {}
        self.prefetched = prefetched or {}

    def _loc(self, path) -> Location:
        rel = posixpath.relpath(os.fspath(path), self.root.path)
        return self.root if rel == "." else self.root.child(rel)

    @contextmanager
    def create_stream(self, path, mode: str):
        if "w" in mode:
            raise NotImplementedError("checkpoint files are written by _CommittingWriter")
        yield io.BytesIO(self.verified_view(path))

    def verified_view(self, path) -> memoryview:
        """A whole file, checked against the commit marker; local files are memory-mapped, not copied."""
        loc = self._loc(path)
        data = self.prefetched.pop(loc.name, None) or loc.read_view()
        want = self.expected.get(loc.name, {})
        if len(data) != want.get("size", len(data)):
            raise CheckpointError(f"{loc.url} is corrupted: {len(data)} bytes, {COMMIT_MARKER} records "
                                  f"{want['size']}")
        # Shards carry a CRC32 per item (checked as each is used); only .metadata has a whole-file one.
        if "crc32" in want and want["crc32"] != zlib.crc32(data):
            raise CheckpointError(f"{loc.url} is corrupted: CRC32 {zlib.crc32(data):08x}, {COMMIT_MARKER} "
                                  f"records {want['crc32']:08x}")
        return data

    def concat_path(self, path, suffix: str):
        return posixpath.join(os.fspath(path), suffix)

    def init_path(self, path):
        return path

    def rename(self, path, new_path) -> None:
        raise NotImplementedError("checkpoint files are never renamed: COMMITTED.json makes them visible")

    def mkdir(self, path) -> None:
        self._loc(path).make_dirs()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False

    def exists(self, path) -> bool:
        return self._loc(path).exists()

    def rm_file(self, path) -> None:
        self._loc(path).delete_file()


@dataclass
class _ChecksummedInfo(_StorageInfo):
    """DCP's per-item storage info plus the CRC32 of the item's bytes, so a reader verifies what it uses."""

    crc32: int = 0


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data


class _CommittingWriter(_FileSystemWriter):
    """One file per rank holding raw tensor bytes back to back: no per-tensor ``torch.save`` archive, since
    shapes and dtypes are in DCP's ``.metadata`` and each item's CRC32 rides along in its storage info."""

    fs: _DcpFileSystem  # type: ignore[assignment]  # torch infers FileSystem; DCP takes any FileSystemBase

    def __init__(self, location: Location, marker: dict, on_commit, refused: str | None = None,
                 before_write: Callable[[], None] | None = None):
        """``refused``: why this save must not write (rank 0's reason; DCP fails the save on every rank).
        ``before_write``: runs on each rank before it writes (in the background for an async save); what it raises
        fails the save."""
        super().__init__(location.path, sync_files=False, overwrite=True)
        self.fs = _DcpFileSystem(location)
        self.location, self.marker, self.on_commit, self.refused = location, marker, on_commit, refused
        self.before_write = before_write

    def prepare_local_plan(self, plan):
        if self.refused:
            raise StorageError(self.refused)
        return super().prepare_local_plan(plan)

    def write_data(self, plan, planner) -> torch.futures.Future:
        if self.before_write is not None:
            self.before_write()
        file_name = f"{plan.storage_data.prefix}0{_DATA_SUFFIX}"
        results, offset = [], 0
        with self.location.child(file_name).open_output() as stream:
            for item in plan.items:
                data = planner.resolve_data(item)
                payload = data.getbuffer() if item.type == WriteItemType.BYTE_IO else _tensor_bytes(data)
                stream.write(payload)
                info = _ChecksummedInfo(file_name, offset, payload.nbytes, crc32=zlib.crc32(payload))
                results.append(WriteResult(index=item.index, size_in_bytes=payload.nbytes, storage_data=info))
                offset += payload.nbytes
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(results)
        return done

    def finish(self, metadata, results) -> None:
        # Like DCP's, minus the tmp-file rename: nothing reads .metadata before COMMITTED.json exists.
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {r.index: r.storage_data for rank_results in results for r in rank_results}
        metadata.storage_meta = self.storage_meta()
        pickled = pickle.dumps(metadata)
        self.location.child(METADATA).write_bytes(pickled)
        files = {METADATA: {"size": len(pickled), "crc32": zlib.crc32(pickled)}}
        for result in (r for rank_results in results for r in rank_results):
            info = result.storage_data
            entry = files.setdefault(info.relative_path, {"size": 0})
            entry["size"] = max(entry["size"], info.offset + info.length)
        marker = {**self.marker, "format": _FORMAT, "version": 1, "files": files, "committed_at": time.time()}
        self.location.child(COMMIT_MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True))
        self.on_commit()


class _RawReader(FileSystemReader):
    """Reads what ``_CommittingWriter`` wrote: verified whole files, tensors rebuilt from raw bytes."""

    fs: _DcpFileSystem  # type: ignore[assignment]  # torch infers FileSystem; DCP takes any FileSystemBase

    def __init__(self, location: Location, expected: dict, prefetched: dict[str, memoryview] | None = None,
                 ranged: bool = False):
        """``ranged``: read each item's bytes alone instead of whole files, for a reader that wants a part of a
        checkpoint (the model without its optimizer state) without holding the rest in memory."""
        super().__init__(location.path)
        self.fs = _DcpFileSystem(location, expected=expected, prefetched=prefetched)
        self.location, self.expected, self.ranged = location, expected, ranged
        self.chunks: dict = {}
        self.metadata_error: SpotrayError | None = None  # DCP reports it inside a message of its own

    def read_metadata(self, *args, **kwargs) -> Metadata:
        """DCP's, reading the one ``.metadata`` this writer leaves, with the module names of older releases."""
        try:
            with self.fs.create_stream(self.fs.concat_path(self.path, METADATA), "rb") as stream:
                metadata = _MetadataUnpickler(stream).load()
        except SpotrayError as exc:
            self.metadata_error = self.metadata_error or exc
            raise
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata, is_coordinator: bool, *args, **kwargs) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        for fqn, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                for chunk in md.chunks:
                    self.chunks[(fqn, tuple(chunk.offsets))] = (md.properties.dtype, tuple(chunk.sizes))

    def read_data(self, plan, planner) -> torch.futures.Future:
        per_file: dict[str, list] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        for relative_path, reqs in per_file.items():
            read_item = self._item_reader(relative_path)
            for req in reqs:
                info = self.storage_data[req.storage_index]
                raw = read_item(info.offset, info.length)
                found, expected = zlib.crc32(raw), getattr(info, "crc32", None)
                if found != expected:
                    recorded = "no CRC32" if expected is None else f"CRC32 {expected:08x}"
                    raise CheckpointError(
                        f"{self.location.child(relative_path).url} is corrupted: item {req.storage_index.fqn} "
                        f"(bytes {info.offset}-{info.offset + info.length}) has CRC32 {found:08x}, .metadata "
                        f"records {recorded}")
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(raw))
                    continue
                dtype, sizes = self.chunks[(req.storage_index.fqn, tuple(req.storage_index.offset))]
                stored = torch.frombuffer(raw, dtype=dtype).reshape(sizes) if info.length else torch.empty(
                    sizes, dtype=dtype)
                target = planner.resolve_tensor(req).detach()
                target.copy_(narrow_tensor_by_index(stored, req.storage_offsets, req.lengths))
                planner.commit_tensor(req, target)
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(None)
        return done

    def _item_reader(self, relative_path: str):
        if not self.ranged:
            data = self.fs.verified_view(self.fs.concat_path(self.path, relative_path))
            return lambda offset, length: data[offset : offset + length]
        file = self.location.child(relative_path)
        handle = file.open_input()  # once per file: each open of an S3 object costs a request
        size, expected = handle.size(), self.expected.get(relative_path, {}).get("size")
        if size != expected:
            raise CheckpointError(f"{file.url} is corrupted: {size} bytes, {COMMIT_MARKER} records {expected}")
        return lambda offset, length: memoryview(bytearray(handle.read_at(length, offset)))


class _MetadataUnpickler(pickle.Unpickler):
    """Checkpoints written before spotray's packages were installed as ``spotray.*`` name ``training.checkpoint``
    classes in their ``.metadata``; a user's own ``training`` package must not be imported in their place."""

    def find_class(self, module: str, name: str):
        return super().find_class(renamed(module) or module, name)


_DONE: Future = Future()  # a retention that has nothing left to do
_DONE.set_result(None)


class Checkpointer:
    """Saves and restores a dict of ``Stateful`` objects; one per training attempt, on every rank.

    A failed save (a storage outage) never stops training: ``SaveFailureBudget`` says when to try again and when
    to give up. Every decision here is taken at the same step on every rank, because DCP reports a failure to all
    ranks alike."""

    warns_of_partial = True  # a partial save left in storage is worth a line
    noun = "checkpoint"  # what the log calls one save

    def __init__(self, run_root: Location, *, rank: int, world_size: int, keep_last: int, async_save: bool = False,
                 failure_budget_s: float = 900.0, max_retry_gap: int = 50, attempt_id: str | None = None,
                 keep_best: bool = False):
        self.root = checkpoints_root(run_root)
        self.set_aside_root = set_aside_root(run_root)
        self.keep_last, self.keep_best, self.async_save = keep_last, keep_best, async_save
        self.rank, self.world_size = rank, world_size
        self.attempt_id = attempt_id or new_attempt_id()
        # The lineage: the step this attempt resumed from (None until it restores) and the steps it committed.
        self.resumed_from: int | None = None
        self._written: set[int] = set()
        self.failures = SaveFailureBudget(failure_budget_s, max_retry_gap)
        # Checkpoint collectives run on their own gloo group so an async save never interleaves with training's.
        self._group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._pending: tuple[int, Future] | None = None
        self._retention = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-retention")
        self._retained: Future | None = None  # the last commit's retention
        self._failed_folders: list[Location] = []  # what failed saves left, removed before the next save writes
        self._stager = _persistent_stager() if async_save else None
        self.last_save_s: float | None = None  # how long the last save took end to end, for deadline decisions
        self.last_committed: CommittedCheckpoint | None = None
        # As each save starts, the check it runs before it writes (``RecordWriter.check_written``), or None.
        self.records_first: Callable[[], Callable[[], None]] | None = None

    def agree(self, value):
        """Rank 0's ``value`` on every rank: for decisions that choose whether a collective happens. On the
        checkpoints' group, so never while a save may be in flight (``cadence.rank0_decides`` is safe then)."""
        return _broadcast(value, self._group)

    @property
    def group(self):
        """The gloo group of checkpoint collectives (None without a process group)."""
        return self._group

    @property
    def writing(self) -> bool:
        """An asynchronous save is still being written in the background."""
        return self._pending is not None and not self._pending[1].done()

    @property
    def failed_saves(self) -> int:
        return self.failures.failed_saves

    def records_check(self) -> Callable[[], None] | None:
        """As a save starts: the check it runs on each rank before it writes (from ``records_first``), or None."""
        return self.records_first() if self.records_first else None

    def retry_due(self, step: int) -> bool:
        """A save failed and its retry is due at this step."""
        return self.failures.retry_due(step)

    def save(self, step: int, state: dict, blocking: bool = False,
             val_loss: float | None = None) -> CommittedCheckpoint | None:
        """Save ``state`` as of ``step`` (whose validation loss, if evaluated, goes into the commit marker). Sync (or
        ``blocking``): returns it once committed, or None if it failed. Async: returns the previous save (waited for,
        so at most one is in flight) and lets this one finish in the background."""
        previous = self.wait()
        untidy = self._tidy_before_writing()
        self.failures.saving()
        location = self.root.child(_step_dir_name(step))
        marker = {"step": step, "world_size": self.world_size, **({} if val_loss is None else {"val_loss": val_loss})}
        writer = _CommittingWriter(location, marker, on_commit=lambda: self.schedule_retention(step), refused=untidy,
                                   before_write=self.records_check())
        started = time.monotonic()
        try:
            if self.async_save and not blocking:
                response = dcp.async_save(state, storage_writer=writer, process_group=self._group,
                                          async_stager=self._stager)
                future = response.upload_completion if isinstance(response, AsyncSaveResponse) else response
                future.add_done_callback(lambda _: self._record_duration(started))
                self._pending = (step, future)
                return previous
            dcp.save(state, storage_writer=writer, process_group=self._group)
        except (Exception, CheckpointException) as exc:  # DCP raises the same error on every rank
            self._failed(step, exc)
            return None
        self._record_duration(started)
        return self._succeeded(step)

    def ensure_saved(self, step: int, state: dict, val_loss: float | None = None) -> CommittedCheckpoint | None:
        """Commit ``step`` now (blocking) unless it is committed already; a committed step is never rewritten."""
        if self._pending is not None and self._pending[0] == step:
            committed = self.wait()
            if committed is not None:
                return committed
        if self.last_committed is not None and self.last_committed.step == step:
            return self.last_committed
        return self.save(step, state, blocking=True, val_loss=val_loss)

    def commit_final(self, step: int, state: dict, val_loss: float | None = None) -> CommittedCheckpoint:
        """Commit ``step``, retrying with backoff through an outage until it succeeds or the budget runs out."""
        committed = self.ensure_saved(step, state, val_loss)
        while committed is None:
            time.sleep(self.failures.final_wait_s())
            committed = self.save(step, state, blocking=True, val_loss=val_loss)
        return committed

    def _record_duration(self, started: float) -> None:
        self.last_save_s = time.monotonic() - started

    def wait(self) -> CommittedCheckpoint | None:
        """Block until the in-flight async save (if any) ends; returns it if it committed, None if it failed."""
        if self._pending is None:
            return None
        step, future = self._pending
        self._pending = None
        try:
            future.result()
        except (Exception, CheckpointException) as exc:
            self._failed(step, exc)
            return None
        return self._succeeded(step)

    def _succeeded(self, step: int) -> CommittedCheckpoint:
        failed = self.failures.succeeded()
        if failed and self.rank == 0:
            log.warning("checkpoint of step %d committed: storage is back after %d failed saves", step, failed)
        self.last_committed = CommittedCheckpoint(step, self.root.child(_step_dir_name(step)), self.world_size, {},
                                                  time.time())
        return self.last_committed

    def _failed(self, step: int, exc: BaseException) -> None:
        self._discard(step)
        budget = self.failures
        now = time.time()
        budget.failed(step, now)
        failing_for = _broadcast(budget.seconds_failing(now), self._group)  # rank 0's clock decides for all
        reason = first_line(exc)
        if budget.exhausted(failing_for):
            raise CheckpointError(
                f"checkpoint saves have failed for {failing_for:.0f}s ({budget.in_a_row} in a row, last at step "
                f"{step}: {reason}); checkpoint.save_failure_budget_s={budget.budget_s:g} is used up: fix access to "
                f"{self.root.url} or raise the budget")
        if self.rank == 0:
            log.warning("checkpoint of step %d failed (%s); training continues, next try at step %d "
                        "(%d failed in a row over %.0fs, budget %gs); nothing partial is ever resumed from", step,
                        reason, budget.retry_at, budget.in_a_row, failing_for, budget.budget_s)

    def _discard(self, step: int) -> None:
        """What the failed save of ``step`` wrote goes before the next save writes."""
        if self.rank == 0:  # the coordinator, which alone commits and deletes
            self._failed_folders.append(self.root.child(_step_dir_name(step)))

    def schedule_retention(self, committed_step: int) -> None:
        """Deleting old checkpoints runs after the commit, in the background; the next save waits for it (it has
        had a whole checkpoint interval), so storage never holds more than ``keep_last`` plus the one being written."""
        self._written.add(committed_step)
        self._retained = self._retention.submit(self._apply_retention, max(self._written))

    def _tidy_before_writing(self) -> str | None:
        """The last commit's retention done, and done again where it failed (an outage: what it could not delete
        would stay beside the new save); at an attempt's first save, what a killed attempt left is retained now. And
        the folders of failed saves gone. Returns, on rank 0, why the save must not write: storage still holds
        what it could not delete (the save fails as in the outage that stopped the deleting, and is tried again)."""
        retained = self._retained
        if retained is not None:
            wait_for([retained])
        if self.rank != 0:
            return None
        try:
            if retained is None or retained.exception() is not None:
                self._apply_retention(max(self._written, default=self.resumed_from or 0))
                self._retained = _DONE
            for folder in list(self._failed_folders):
                folder.delete_tree()
                self._failed_folders.remove(folder)
        except StorageError as exc:
            return f"older checkpoints past keep_last={self.keep_last} could not be deleted first: {first_line(exc)}"
        return None

    def abandon(self) -> None:
        """The attempt failed: the save in flight is left to fail with its process group, and nothing waits for it
        or for retention (whose thread ends once idle)."""
        self._pending = None
        self._retention.shutdown(wait=False)

    def close(self) -> None:
        """Wait for the in-flight save and for retention to finish."""
        self.wait()
        self._retention.shutdown(wait=True)
        if self._stager is not None:
            self._stager.close()

    def _apply_retention(self, newest: int) -> None:
        """Applies ``retained`` to this attempt's lineage; ``newest`` is its newest commit."""
        listed = list_committed(self.root, warn=False, damaged=True)
        lineage = [c for c in listed if c.damage is None and self._in_lineage(c.step)]
        kept = retained(lineage, self.keep_last, self.keep_best)
        for old in lineage:
            if old not in kept:
                log.info("retention: deleting %s step %d (keep_last=%d%s)", self.noun, old.step, self.keep_last,
                         ", keep_best" if self.keep_best else "")
                old.location.delete_tree()
        with_marker = {c.step for c in listed}
        for name in self.root.list_names():
            step = _parse_step(name)
            if step is not None and step < newest and step not in with_marker:
                self.root.child(name).delete_tree()  # a partial save older than a committed one is garbage

    def _in_lineage(self, step: int) -> bool:
        """A checkpoint above the step this attempt resumed from is of its lineage only if it wrote it; a
        Checkpointer that never restored takes every committed checkpoint as its own."""
        return self.resumed_from is None or step <= self.resumed_from or step in self._written

    def committed(self) -> list[CommittedCheckpoint]:
        """The committed checkpoints, newest first, as rank 0 lists them (a collective); those whose commit marker
        is damaged are listed with their ``damage``."""
        listed = list_committed(self.root, warn=self.warns_of_partial, damaged=True) if self.rank == 0 else None
        return _broadcast(listed, self._group)

    def restore_latest(self, state: dict, per_rank_keys: tuple[str, ...] = (),
                       prefetch: RestorePrefetch | None = None,
                       candidates: list[CommittedCheckpoint] | None = None) -> CommittedCheckpoint | None:
        """Load the newest committed checkpoint that reads back intact; returns it, or None for a fresh run.

        ``per_rank_keys`` name entries saved separately by each rank (e.g. RNG streams): they are restored only
        when the world size is unchanged. ``prefetch`` has the newest checkpoint's bytes read already;
        ``candidates`` is ``committed()`` when the caller has listed them already.
        """
        candidates = self.committed() if candidates is None else candidates
        if candidates and candidates[0].is_files:
            raise CheckpointError(f"{self.root.url} holds a training script's checkpoints (spotray train --script): "
                                  "resume it with the same --script, or train this config under a new run.name")
        restored = self.restore_first(candidates, lambda c: self._load(c, state, per_rank_keys, prefetch))
        self.last_committed = restored or self.last_committed
        return restored

    def restore_first(self, candidates: list[CommittedCheckpoint],
                      load: Callable[[CommittedCheckpoint], str | None]) -> CommittedCheckpoint | None:
        """The first of ``candidates`` that ``load`` reads (it returns None, or why it cannot: the same on every
        rank); those before it are set aside. None where there are none; CheckpointError where none reads."""
        unreadable: list[tuple[CommittedCheckpoint, str]] = []
        for candidate in candidates:
            reason = candidate.damage or load(candidate)
            if reason is None:
                self.start_lineage(candidate.step, unreadable)
                return candidate
            log.info("cannot restore checkpoint step %d at %s: %s", candidate.step, candidate.url, reason)
            unreadable.append((candidate, reason))
        if unreadable:
            by_reason: dict[str, list[str]] = {}
            for checkpoint, reason in unreadable:
                by_reason.setdefault(reason, []).append(str(checkpoint.step))
            steps = "; ".join(f"step{'s' if len(numbers) > 1 else ''} {', '.join(numbers)}: {reason}"
                              for reason, numbers in by_reason.items())
            raise Unrestorable(f"no committed checkpoint under {self.root.url} could be read ({steps}): "
                                  "restore them or start a new run.name")
        self.start_lineage(0, [])
        return None

    def _load(self, candidate: CommittedCheckpoint, state: dict, per_rank_keys: tuple[str, ...],
              prefetch: RestorePrefetch | None) -> str | None:
        """Loads ``candidate`` into ``state``; None, or why it cannot be read (the same on every rank)."""
        to_load = state if candidate.world_size == self.world_size else {
            k: v for k, v in state.items() if k not in per_rank_keys}
        reader = _RawReader(candidate.location, candidate.files,
                            prefetch.files_for(candidate.location) if prefetch else None)
        try:
            dcp.load(to_load, storage_reader=reader, process_group=self._group)
        except (Exception, CheckpointException) as exc:  # DCP raises the same error on every rank
            causes = [reader.metadata_error] if reader.metadata_error else _causes(exc)
            # Only what the bytes themselves show (damage, a missing file) on every rank is a reason to go back to
            # an older checkpoint: an outage or an unexpected error must not cost the newest one its place.
            verdicts = all_gather_objects((first_line(causes[0]), all(isinstance(c, (CheckpointError, NotFound))
                                                                for c in causes)), self._group)
            reason = verdicts[0][0]
            if not all(damaged for _, damaged in verdicts):
                raise CheckpointError(f"checkpoint step {candidate.step} could not be restored ({reason}); nothing "
                                      "was skipped or set aside, and a restart tries it again") from exc
            return reason
        return None

    def start_lineage(self, step: int, unreadable: list[tuple[CommittedCheckpoint, str]]) -> None:
        """This attempt resumes from ``step``: the checkpoints above it that could not be read are set aside
        before anything is saved (rank 0 moves them; every rank learns whether that worked)."""
        self.resumed_from = step
        error = None
        if self.rank == 0:
            try:
                for checkpoint, reason in unreadable:
                    self._set_aside(checkpoint, reason, step)
            except StorageError as exc:
                error = (f"checkpoint step {checkpoint.step} could not be set aside ({exc}): the attempt stops rather "
                         "than overwrite it; a restart tries again")
        error = _broadcast(error, self._group)
        if error:
            raise CheckpointError(error)

    def _set_aside(self, checkpoint: CommittedCheckpoint, reason: str, resumed_from: int) -> None:
        dest = self.set_aside_root.child(f"{checkpoint.location.name}.{self.attempt_id}")
        record = {"step": checkpoint.step, "reason": reason, "resumed_from": resumed_from,
                  "set_aside_by": self.attempt_id, "at": time.time()}
        checkpoint.location.child(SET_ASIDE_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))
        checkpoint.location.move_tree_to(dest, last=COMMIT_MARKER)
        log.warning("checkpoint step %d cannot be read (%s): set aside in %s; the run goes on from step %d",
                    checkpoint.step, reason, dest.url, resumed_from)


def _persistent_stager() -> DefaultStager:
    """One stager for the whole run, so its staging buffers are allocated once, not on every save."""
    cuda = torch.cuda.is_available()
    return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=cuda,
                                        use_non_blocking_copy=cuda))


class RestorePrefetch:
    """Reads a committed checkpoint's files in the background, so that a restarted worker fetches its
    checkpoint while it builds the model instead of after. The restore verifies the bytes as usual."""

    def __init__(self, checkpoint: CommittedCheckpoint):
        self.checkpoint = checkpoint
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-prefetch")
        self._future = self._pool.submit(self._read)
        self._pool.shutdown(wait=False)

    def _read(self) -> dict[str, memoryview]:
        return {name: self.checkpoint.location.child(name).read_view() for name in self.checkpoint.files}

    def files_for(self, location: Location) -> dict[str, memoryview]:
        if location.url != self.checkpoint.url:
            return {}
        try:
            return self._future.result()
        except Exception:  # noqa: BLE001 - the restore reads the files again and reports what is wrong
            return {}


def model_tensors(checkpoint: CommittedCheckpoint, key: str = "model") -> dict[str, tuple[torch.dtype, tuple]]:
    """The full dtype and shape of every model tensor in a checkpoint (saved by ``ModelOptimState`` under
    ``key``), from its ``.metadata``."""
    metadata = _RawReader(checkpoint.location, checkpoint.files).read_metadata()
    prefix = f"{key}.model."
    return {fqn[len(prefix):]: (md.properties.dtype, tuple(md.size))
            for fqn, md in metadata.state_dict_metadata.items()
            if fqn.startswith(prefix) and isinstance(md, TensorStorageMetadata)}


def load_model_tensors(checkpoint: CommittedCheckpoint, names: list[str], key: str = "model") -> dict:
    """Full (unsharded) copies of the named model tensors, in this process, without a process group: each
    rank's shards are read by byte range, and checked against their CRC32."""
    shapes = model_tensors(checkpoint, key)
    tensors = {name: torch.empty(shapes[name][1], dtype=shapes[name][0]) for name in names}
    reader = _RawReader(checkpoint.location, checkpoint.files, ranged=True)
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load({key: {"model": tensors}}, storage_reader=reader, no_dist=True)
    except (Exception, CheckpointException) as exc:
        raise CheckpointError(f"checkpoint step {checkpoint.step} at {checkpoint.url} cannot be read: "
                              f"{first_line(exc)}") from None
    return tensors


_MODEL_RECORD, _TOKENIZER = "model.json", "tokenizer.json"


def write_model_record(run_root: Location, record: dict, tokenizer_files: dict[str, Location]) -> None:
    """What ``spotray export`` needs besides the weights: the task's export spec, and a copy of the dataset's
    tokenizer files (each copied once: a run keeps its data)."""
    root = checkpoints_root(run_root)
    for name, source in tokenizer_files.items():
        if not root.child(name).exists():
            root.child(name).write_bytes(source.read_bytes())
    record = {**record, "tokenizer_files": list(tokenizer_files)}
    root.child(_MODEL_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))


def read_model_record(run_root: Location) -> tuple[dict | None, dict[str, bytes]]:
    """The model record, and the tokenizer files copied with it by name (a record from before the companion files
    lists none: its tokenizer.json, if any)."""
    root = checkpoints_root(run_root)
    text = root.child(_MODEL_RECORD).read_text_if_exists()
    record = json.loads(text) if text is not None else None
    names = record.get("tokenizer_files", [_TOKENIZER]) if record is not None else [_TOKENIZER]
    found = {name: root.child(name).read_bytes_if_exists() for name in names}
    return record, {name: data for name, data in found.items() if data is not None}


def list_committed(root: Location, warn: bool = True, damaged: bool = False) -> list[CommittedCheckpoint]:
    """Committed checkpoints under a ``checkpoints/`` root, newest first; partial ones are logged and skipped.
    ``damaged``: also those whose commit marker is there but cannot be read, with their ``damage``."""
    found = []
    for name in root.list_names():
        step = _parse_step(name)
        if step is None:
            continue
        location = root.child(name)
        try:
            marker = _read_marker(location)
        except CheckpointError as exc:
            if damaged:
                found.append(CommittedCheckpoint(step, location, 0, {}, 0.0, damage=str(exc)))
            elif warn:
                log.warning("skipping checkpoint %s: %s", location.url, exc)
            continue
        if marker is None:
            if warn:
                log.warning("skipping checkpoint %s: no %s (partial or interrupted save)", location.url,
                            COMMIT_MARKER)
            continue
        found.append(CommittedCheckpoint(step, location, int(marker["world_size"]), marker["files"],
                                         float(marker.get("committed_at", 0.0)), val_loss=marker.get("val_loss"),
                                         format=marker["format"]))
    return sorted(found, key=lambda c: c.step, reverse=True)


def _read_marker(location: Location) -> dict | None:
    """The commit marker; None where there is none (a partial save), CheckpointError where it is damaged."""
    marker_loc = location.child(COMMIT_MARKER)
    if not marker_loc.exists():
        return None
    try:
        marker = json.loads(marker_loc.read_text())
    except (ValueError, UnicodeDecodeError):
        marker = None
    required = {"step", "world_size", "files", "format"}
    if not isinstance(marker, dict) or not required <= marker.keys() or marker["format"] not in (_FORMAT,
                                                                                                FILES_FORMAT):
        raise CheckpointError(f"{marker_loc.url} is damaged: not a {_FORMAT} commit marker")
    return marker


def list_set_aside(run_root: Location) -> list[dict]:
    """The checkpoints set aside from the run's lineage, oldest step first: each one's record and where it is."""
    root = set_aside_root(run_root)
    records = []
    for name in root.list_names():
        record = root.child(name, SET_ASIDE_RECORD)
        if record.exists():
            records.append({**json.loads(record.read_text()), "url": root.child(name).url})
    return sorted(records, key=lambda r: (r["step"], r["at"]))


def _parse_step(name: str) -> int | None:
    if name.startswith("step_") and name[5:].isdigit():
        return int(name[5:])
    return None


def _broadcast(obj, group):
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def all_gather_objects(value, group) -> list:
    if not dist.is_initialized():
        return [value]
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def _causes(exc: BaseException) -> list[BaseException]:
    """The errors behind DCP's (it gathers each failing rank's, lowest rank first), spotray's own first."""
    if not isinstance(exc, CheckpointException) or not exc.failures:
        return [exc]
    errors = [exc.failures[rank][0] for rank in sorted(exc.failures)]
    return sorted(errors, key=lambda e: not isinstance(e, SpotrayError))


def only_caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether every error behind ``exc`` (for DCP's, each failing rank's) is a ``kind``."""
    return all(isinstance(cause, kind) for cause in _causes(exc))


def first_line(exc: BaseException) -> str:
    """What went wrong, in one line: the error's own message (for DCP's, that of the error behind it), its type
    named unless it is spotray's."""
    exc = _causes(exc)[0]
    text = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, SpotrayError):
        return text[:300]
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


class RngState:
    """This rank's RNG streams, as a Stateful."""

    def __init__(self, rank: int):
        self.rank = rank

    def state_dict(self) -> dict:
        return {f"rank{self.rank}": rng_state()}

    def load_state_dict(self, state: dict) -> None:
        mine = state[f"rank{self.rank}"]
        torch.set_rng_state(mine["cpu"])
        if "cuda" in mine and torch.cuda.is_available():
            torch.cuda.set_rng_state(mine["cuda"])


def kept_interval(kept_steps: list[int]) -> int | None:
    """The run's fixed checkpoint interval, from its kept checkpoints: the smallest gap between two of them that
    every kept step but the newest (which may be a final commit) is a multiple of. None where none fits (``auto``
    intervals drift; one checkpoint shows no gap)."""
    steps = sorted(kept_steps)
    for gap in sorted({b - a for a, b in zip(steps, steps[1:], strict=False)}):
        if all(step % gap == 0 for step in steps[:-1]):
            return gap
    return None
