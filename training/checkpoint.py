"""Sharded, committed, verifiable checkpoints with torch.distributed.checkpoint (DCP) on any storage URL.

Layout of a run (the only place that knows it)::

    <checkpoint.path>/<run.name>/checkpoints/step_000000040/
        .metadata  __0_0.distcp  __1_0.distcp  __0.sums.json  __1.sums.json  COMMITTED.json

Every rank writes its own shard straight to storage. The coordinator's ``finish`` runs only after all ranks
have written, and writes ``COMMITTED.json`` (sizes and CRC32s of every file) last: a directory without it is a
partial save and is never resumed from. Reads verify sizes and checksums, so a corrupted checkpoint fails
to load on every rank alike (DCP gathers per-rank errors) and the next older one is used.
"""

from __future__ import annotations

import io
import json
import logging
import os
import posixpath
import time
import zlib
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader, _FileSystemWriter

from training.errors import CheckpointError
from training.storage import Location

log = logging.getLogger(__name__)

COMMIT_MARKER = "COMMITTED.json"
_FORMAT = "spotray-checkpoint"
_CHECKSUMS = "__{rank}.sums.json"


@dataclass(frozen=True)
class CommittedCheckpoint:
    step: int
    location: Location
    world_size: int
    files: dict

    @property
    def url(self) -> str:
        return self.location.url


def checkpoints_root(run_root: Location) -> Location:
    return run_root.child("checkpoints")


def _step_dir_name(step: int) -> str:
    return f"step_{step:09d}"


class _HashingStream(io.RawIOBase):
    """Write-through stream that records size and CRC32 of everything written, for the commit marker."""

    def __init__(self, raw, on_close):
        self._raw, self._on_close = raw, on_close
        self._crc, self._size = 0, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data)
        self._raw.write(view)
        self._crc = zlib.crc32(view, self._crc)
        self._size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self._size

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
            self._on_close(self._size, self._crc)
        super().close()


class _DcpFileSystem(FileSystemBase):
    """DCP's filesystem seam over a storage Location: checksums what it writes, verifies what it reads."""

    def __init__(self, root: Location, expected: dict | None = None):
        self.root = root
        self.expected = expected or {}
        self.written: dict[str, dict] = {}

    def _loc(self, path) -> Location:
        rel = posixpath.relpath(os.fspath(path), self.root.path)
        return self.root if rel == "." else self.root.child(rel)

    @contextmanager
    def create_stream(self, path, mode: str):
        loc = self._loc(path)
        if "w" in mode:
            def record(size: int, crc: int) -> None:
                self.written[loc.name] = {"size": size, "crc32": crc}

            stream = _HashingStream(loc.open_output(), record)
            with stream:
                yield stream
            return
        yield io.BytesIO(self._verified_bytes(loc))

    def _verified_bytes(self, loc: Location) -> bytes:
        data = loc.read_bytes()
        want = self.expected.get(loc.name)
        if want is not None and (len(data) != want["size"] or zlib.crc32(data) != want["crc32"]):
            raise CheckpointError(f"{loc.url} is corrupted (size or CRC32 differs from {COMMIT_MARKER})")
        return data

    def concat_path(self, path, suffix: str):
        return posixpath.join(os.fspath(path), suffix)

    def init_path(self, path):
        return path

    def rename(self, path, new_path) -> None:
        src, dst = self._loc(path), self._loc(new_path)
        self.root.fs.move(src.path, dst.path)
        if src.name in self.written:
            self.written[dst.name] = self.written.pop(src.name)

    def mkdir(self, path) -> None:
        if not self.root.is_s3:
            self.root.fs.create_dir(os.fspath(path), recursive=True)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False

    def exists(self, path) -> bool:
        return self._loc(path).exists()

    def rm_file(self, path) -> None:
        self._loc(path).delete_file()


class _CommittingWriter(_FileSystemWriter):
    def __init__(self, location: Location, marker: dict, on_commit):
        super().__init__(location.path, sync_files=False, overwrite=True)
        self.fs = _DcpFileSystem(location)
        self.location, self.marker, self.on_commit = location, marker, on_commit

    def write_data(self, plan, planner):
        written = super().write_data(plan, planner)
        written.wait()  # the parent writes synchronously; this just surfaces its errors before the sidecar
        self.location.child(_CHECKSUMS.format(rank=self.rank or 0)).write_text(json.dumps(self.fs.written))
        return written

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)
        files = dict(self.fs.written)  # .metadata
        for rank in range(len(results)):
            files.update(json.loads(self.location.child(_CHECKSUMS.format(rank=rank)).read_text()))
        marker = {**self.marker, "format": _FORMAT, "version": 1, "files": files, "committed_at": time.time()}
        self.location.child(COMMIT_MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True))
        self.on_commit()


class Checkpointer:
    """Saves and restores a dict of ``Stateful`` objects; one per training attempt, on every rank."""

    def __init__(self, run_root: Location, keep_last: int, async_save: bool, rank: int, world_size: int):
        self.root = checkpoints_root(run_root)
        self.keep_last, self.async_save = keep_last, async_save
        self.rank, self.world_size = rank, world_size
        # Checkpoint collectives run on their own gloo group so an async save never interleaves with training's.
        self._group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._pending: tuple[int, Future] | None = None

    def save(self, step: int, state: dict, meta: dict | None = None) -> CommittedCheckpoint | None:
        """Save ``state`` as of ``step``. Sync: returns it once committed. Async: returns the previous save
        (waited for, so at most one is in flight) and lets this one finish in the background."""
        previous = self.wait()
        location = self.root.child(_step_dir_name(step))
        marker = {"step": step, "world_size": self.world_size, **(meta or {})}
        writer = _CommittingWriter(location, marker, on_commit=self._apply_retention)
        if self.async_save:
            future = dcp.async_save(state, storage_writer=writer, process_group=self._group)
            self._pending = (step, getattr(future, "upload_completion", future))
            return previous
        dcp.save(state, storage_writer=writer, process_group=self._group)
        return self._committed(step)

    def wait(self) -> CommittedCheckpoint | None:
        """Block until the in-flight async save (if any) is committed and return it."""
        if self._pending is None:
            return None
        step, future = self._pending
        self._pending = None
        future.result()
        return self._committed(step)

    def _committed(self, step: int) -> CommittedCheckpoint:
        location = self.root.child(_step_dir_name(step))
        return CommittedCheckpoint(step, location, self.world_size, {})

    def _apply_retention(self) -> None:
        committed = list_committed(self.root)
        newest = committed[0].step if committed else -1
        for old in committed[self.keep_last :]:
            log.info("retention: deleting checkpoint step %d (keep_last=%d)", old.step, self.keep_last)
            old.location.delete_tree()
        committed_steps = {c.step for c in committed}
        for name in self.root.list_names():
            step = _parse_step(name)
            if step is not None and step < newest and step not in committed_steps:
                self.root.child(name).delete_tree()  # a partial save older than a committed one is garbage

    def restore_latest(self, state: dict, per_rank_keys: tuple[str, ...] = ()) -> CommittedCheckpoint | None:
        """Load the newest committed checkpoint that reads back intact; returns it, or None for a fresh run.

        ``per_rank_keys`` name entries saved separately by each rank (e.g. RNG streams): they are restored only
        when the world size is unchanged.
        """
        candidates = list_committed(self.root) if self.rank == 0 else None
        candidates = _broadcast(candidates, self._group)
        failures = []
        for candidate in candidates:
            to_load = state if candidate.world_size == self.world_size else {
                k: v for k, v in state.items() if k not in per_rank_keys}
            reader = FileSystemReader(candidate.location.path)
            reader.fs = _DcpFileSystem(candidate.location, expected=candidate.files)
            try:
                dcp.load(to_load, storage_reader=reader, process_group=self._group)
            except (Exception, CheckpointException) as exc:  # DCP raises the same error on every rank
                reason = _first_line(exc)
                log.warning("skipping checkpoint step %d at %s: %s", candidate.step, candidate.url, reason)
                failures.append(f"step {candidate.step}: {reason}")
                continue
            return candidate
        if failures:
            raise CheckpointError(
                f"no committed checkpoint under {self.root.url} could be read ({'; '.join(failures)}): "
                "restore them or start a new run.name"
            )
        return None


def list_committed(root: Location) -> list[CommittedCheckpoint]:
    """Committed checkpoints under a ``checkpoints/`` root, newest first; partial ones are logged and skipped."""
    found = []
    for name in root.list_names():
        step = _parse_step(name)
        if step is None:
            continue
        location = root.child(name)
        marker = _read_marker(location)
        if marker is None:
            log.warning("skipping checkpoint %s: no valid %s (partial or interrupted save)",
                        location.url, COMMIT_MARKER)
            continue
        found.append(CommittedCheckpoint(step, location, int(marker["world_size"]), marker["files"]))
    return sorted(found, key=lambda c: c.step, reverse=True)


def _read_marker(location: Location) -> dict | None:
    marker_loc = location.child(COMMIT_MARKER)
    if not marker_loc.exists():
        return None
    try:
        marker = json.loads(marker_loc.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    required = {"step", "world_size", "files", "format"}
    if not isinstance(marker, dict) or not required <= marker.keys() or marker["format"] != _FORMAT:
        return None
    return marker


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or exc.__class__.__name__
    for line in text.splitlines():
        if "Corrupt" in line or "corrupted" in line:
            return line.strip()
    return text.splitlines()[0][:300]


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
