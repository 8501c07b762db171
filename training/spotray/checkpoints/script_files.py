"""A script's own checkpoint files (a Trainer's ``checkpoint-N``, Accelerate's ``save_state``) committed to the run's
storage and fetched back, with the lineage, retention and commit marker of spotray's checkpoints.

Layout: ``checkpoints/step_N/files/<the directory's files>`` and ``COMMITTED.json`` (``format: spotray-files``,
every file's size and CRC32), written by rank 0 only after every rank reported its files in storage.

One copy per file, one download per directory: every rank lists the directory, and a file is uploaded by the
lowest rank that has it (ranks sharing a disk see the same files); of the ranks whose restore directory is the same
(host and path: a node's local disk) one downloads it for all: the one whose prefetch is under way (``FilesPrefetch``:
the first worker of a node to lock the run's local dir starts the download as it starts, so that it arrives while the
script imports and builds its model), else the lowest. A node takes the files it committed itself from its own disk
(the directory the newest commit of its ranks came from, recorded in the run's local dir), each checked against the
marker's size and CRC32, and downloads only the rest: after a node is lost, the nodes that survived read little or
nothing.
An upload overlaps training (``Checkpointer.async_save``-like: at most one in flight); ``wait`` ends it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch.distributed as dist

from spotray.checkpoints.dcp import (
    COMMIT_MARKER,
    FILES_FORMAT,
    Checkpointer,
    CommittedCheckpoint,
    all_gather_objects,
    list_committed,
)
from spotray.errors import CheckpointError, NotFound, SpotrayError
from spotray.storage import Location

log = logging.getLogger(__name__)

FILES_DIR = "files"
CHUNK_BYTES = 64 * 2**20
DOWNLOAD_THREADS = 8  # files fetched at once: one GET stream each
RESTORED_MARK = ".spotray-restored"  # in a directory ``restore`` filled (may be replaced); its step, bytes read
OWN_COPY = "committed-from.json"  # in the node's local dir: the step its ranks last committed, and from where
DISK_HEADROOM = 1.05


class FilesCheckpoints:
    """Commit and restore of a local directory's files, on every rank (every method is a collective)."""

    def __init__(self, checkpointer: Checkpointer, node_dir: Path | None = None):
        self.checkpointer = checkpointer
        self.node_dir = node_dir  # the run's local dir on this node, where its own committed copy is recorded
        self.rank, self.world_size = checkpointer.rank, checkpointer.world_size
        # Uploads finish in a background thread whose collectives need a group of their own.
        self._group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotray-commit")
        self._pending: tuple[int, Future] | None = None
        self.committed: list[int] = []  # steps this attempt committed, oldest first
        self.last_save_s: float | None = None
        self.bytes_read = 0  # by this rank's downloads, for the restore's one-copy-per-node check
        self.nbytes = 0  # of the last commit, all ranks' files
        self.prefetch: FilesPrefetch | None = None

    def commit(self, local_dir: str, step: int) -> None:
        """Start committing what the ranks wrote to ``local_dir`` as ``step``; returns once uploads are under way."""
        self.wait()
        all_gather_objects(None, self.checkpointer.group)  # every rank has finished writing
        listings = all_gather_objects(_list_files(Path(local_dir)), self.checkpointer.group)
        if not any(listings):
            raise CheckpointError(f"spotray.commit({local_dir!r}, {step}): the directory holds no files on any node; "
                                  "commit the directory the script saved to, after saving")
        mine = _assigned(listings, self.rank)
        self.nbytes = sum({name: size for listing in reversed(listings) for name, size in listing.items()}.values())
        location = self.checkpointer.root.child(f"step_{step:09d}")
        started = time.monotonic()
        self._pending = (step, self._pool.submit(self._upload, Path(local_dir), mine, location, step, started,
                                                 self.checkpointer.records_check()))

    @property
    def in_flight(self) -> bool:
        return self._pending is not None

    def wait(self) -> bool:
        """Ends the commit in flight; whether it committed (True where none was in flight)."""
        if self._pending is None:
            return True
        step, future = self._pending
        self._pending = None
        return future.result()

    def _upload(self, local_dir: Path, names: list[str], location: Location, step: int, started: float,
                records_check: Callable[[], None] | None) -> bool:
        error, entries = None, {}
        try:
            if records_check is not None:
                records_check()
            for name in names:
                entries[f"{FILES_DIR}/{name}"] = _put(local_dir / name, location.child(FILES_DIR, name))
        except (OSError, SpotrayError) as exc:
            error = f"rank {self.rank}: {str(exc).splitlines()[0][:200]}"
        reports = all_gather_objects((error, entries), self._group)
        errors = [e for e, _ in reports if e]
        if errors:
            if self.rank == 0:
                log.warning("checkpoint of step %d not committed (%s); training continues, the next commit tries "
                            "again, and nothing partial is ever resumed from", step, "; ".join(errors))
            return False
        if self.rank == 0:
            files = {name: entry for _, part in reports for name, entry in part.items()}
            marker = {"step": step, "world_size": self.world_size, "format": FILES_FORMAT, "version": 1,
                      "files": files, "committed_at": time.time()}
            location.child(COMMIT_MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True))
            self.checkpointer.schedule_retention(step)
        all_gather_objects(None, self._group)  # the marker is written: every rank may count the step as committed
        if self.node_dir is not None:
            _record_own_copy(self.node_dir, step, local_dir)
        self.committed.append(step)
        self.last_save_s = time.monotonic() - started
        if self.rank == 0:
            log.info("checkpoint of step %d committed: %d files, %.1f MB uploaded in %.2fs", step,
                     sum(len(part) for _, part in reports), self.nbytes / 1e6, self.last_save_s)
        return True

    def restore(self, local_dir: str, candidates: list[CommittedCheckpoint]) -> CommittedCheckpoint | None:
        """The newest of ``candidates`` that downloads intact, in ``local_dir`` on every node; None for none."""
        try:
            return self.checkpointer.restore_first(candidates, lambda c: self._fetch(c, Path(local_dir)))
        finally:
            self.drop_prefetch()

    def drop_prefetch(self) -> None:
        if self.prefetch is not None:
            self.prefetch.discard()
            self.prefetch = None

    def _fetch(self, candidate: CommittedCheckpoint, local_dir: Path) -> str | None:
        """One rank per directory downloads, the others wait; why it cannot be read (the same on every rank), or
        None."""
        reason, unexpected = None, None
        if _downloader(local_dir, self.prefetch is not None, self.checkpointer.group) == self.rank:
            try:
                started = time.monotonic()
                fetched = self.prefetch.take(candidate) if self.prefetch else None
                read = _adopt(*fetched, local_dir) if fetched else _download(
                    candidate, local_dir, own_copy(self.node_dir, candidate.step))
                self.bytes_read += read
                log.info("restored step %d into %s: %.1f MB read by this rank%s in %.2fs", candidate.step,
                         local_dir, read / 1e6, " (prefetched)" if fetched else "", time.monotonic() - started)
            except (CheckpointError, NotFound) as exc:
                reason = str(exc)
            except SpotrayError as exc:  # an outage, a full disk: not a reason to skip the checkpoint
                unexpected = str(exc)
        verdicts = all_gather_objects((reason, unexpected), self.checkpointer.group)
        problems = [u for _, u in verdicts if u]
        if problems:
            raise CheckpointError(f"checkpoint step {candidate.step} could not be restored ({problems[0]}); nothing "
                                  "was skipped or set aside, and a restart tries it again")
        reasons = [r for r, _ in verdicts if r]
        return reasons[0] if reasons else None

    def close(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)
        self.drop_prefetch()


class FilesPrefetch:
    """The newest committed checkpoint of ``root``, downloaded in the background into ``scratch`` (this process's
    own folder), from the moment a worker starts; ``take`` hands it to the restore that wants that checkpoint."""

    def __init__(self, root: Location, scratch: Path, lock: int):
        self.scratch, self._lock = scratch, lock
        self._node_dir = scratch.parent
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotray-prefetch")
        self._future = pool.submit(self._fetch, root)
        pool.shutdown(wait=False)

    @classmethod
    def on_this_disk(cls, root: Location, local_dir: Path) -> FilesPrefetch | None:
        """Started by the first process of a node to lock ``local_dir`` (one per node's disk); None in the others."""
        try:
            local_dir.mkdir(parents=True, exist_ok=True)
            lock = os.open(local_dir / ".prefetch.lock", os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:  # an unwritable local dir: the restore says so, if there is anything to restore
            return None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            return None
        scratch = local_dir / "prefetch"
        shutil.rmtree(scratch, ignore_errors=True)  # a killed worker's
        return cls(root, scratch, lock)

    def _fetch(self, root: Location) -> tuple[CommittedCheckpoint, Path, int] | None:
        newest = list_committed(root, warn=False)[:1]
        if not newest or not newest[0].is_files:
            return None
        directory = self.scratch / f"step_{newest[0].step}"
        return newest[0], directory, _download(newest[0], directory, own_copy(self._node_dir, newest[0].step))

    def take(self, checkpoint: CommittedCheckpoint) -> tuple[Path, int] | None:
        """The fetched directory and the bytes read, where it is ``checkpoint`` and arrived intact."""
        try:
            fetched = self._future.result()
        except Exception as exc:  # noqa: BLE001 - the restore downloads again and reports what is wrong
            log.info("the prefetch of the newest checkpoint failed (%s); downloading it now", exc)
            return None
        if fetched is None or fetched[0].url != checkpoint.url:
            return None
        return fetched[1], fetched[2]

    def discard(self) -> None:
        """Whatever was fetched and not taken, once the download has ended."""
        try:
            self._future.result()
        except Exception:  # noqa: BLE001 - take() has said why; only the leftovers matter here
            pass
        shutil.rmtree(self.scratch, ignore_errors=True)
        os.close(self._lock)


def _downloader(local_dir: Path, prefetching: bool, group) -> int:
    """The rank that fetches ``local_dir`` for every rank restoring into the same folder (same host and path): the
    one whose prefetch is under way, else the lowest."""
    where = (socket.gethostname(), os.path.realpath(local_dir))
    ranks = all_gather_objects((where, prefetching), group)
    sharing = [rank for rank, (their, _) in enumerate(ranks) if their == where]
    return next((rank for rank in sharing if ranks[rank][1]), sharing[0])


def _list_files(local_dir: Path) -> dict[str, int]:
    """Relative path -> size of every file under ``local_dir`` (none where it does not exist)."""
    if not local_dir.is_dir():
        return {}
    return {p.relative_to(local_dir).as_posix(): p.stat().st_size
            for p in sorted(local_dir.rglob("*")) if p.is_file() and p.name != RESTORED_MARK}


def _assigned(listings: list[dict[str, int]], rank: int) -> list[str]:
    """The files ``rank`` uploads: those no lower rank has."""
    seen = set().union(*listings[:rank]) if rank else set()
    return sorted(set(listings[rank]) - seen)


def _put(source: Path, target: Location) -> dict:
    """Streams one file up, computing its CRC32 on the way; its marker entry."""
    with open(source, "rb") as f, target.open_output() as out:
        size, crc = _copy(f, out)
    return {"size": size, "crc32": crc}


def _copy(source, out) -> tuple[int, int]:
    """Streams ``source`` into ``out`` in chunks; the bytes copied and their CRC32."""
    crc, size = 0, 0
    while chunk := source.read(CHUNK_BYTES):
        crc, size = zlib.crc32(chunk, crc), size + len(chunk)
        out.write(chunk)
    return size, crc


def _download(checkpoint: CommittedCheckpoint, local_dir: Path, own: Path | None = None) -> int:
    """Every file of ``checkpoint`` into ``local_dir`` (replaced whole), checked against the marker: from ``own``
    (this node's copy) where it holds the file intact, else from storage; bytes read from storage."""
    _check_space(local_dir, checkpoint.nbytes)
    staging = local_dir.with_name(f".{local_dir.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    def fetch(name: str) -> int:
        relative, want = name.removeprefix(f"{FILES_DIR}/"), checkpoint.files[name]
        if own is not None and _copy_own(own / relative, want, staging / relative):
            return 0
        return _get(checkpoint.location.child(name), want, staging / relative)

    try:
        with ThreadPoolExecutor(max_workers=DOWNLOAD_THREADS, thread_name_prefix="spotray-restore") as pool:
            sizes = list(pool.map(fetch, checkpoint.files))
    except CheckpointError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    (staging / RESTORED_MARK).write_text(json.dumps({"step": checkpoint.step, "bytes_read": sum(sizes)}))
    _replace(local_dir, staging)
    return sum(sizes)


def _adopt(fetched: Path, read: int, local_dir: Path) -> int:
    """A prefetched checkpoint directory becomes ``local_dir``; the bytes its download read."""
    local_dir.parent.mkdir(parents=True, exist_ok=True)
    _replace(local_dir, fetched)
    return read


def _record_own_copy(node_dir: Path, step: int, local_dir: Path) -> None:
    """After a commit: this node holds ``step``'s files it listed, in ``local_dir`` (written atomically)."""
    node_dir.mkdir(parents=True, exist_ok=True)
    record = node_dir / f".{OWN_COPY}.{os.getpid()}"
    record.write_text(json.dumps({"step": step, "dir": str(local_dir.resolve())}))
    record.replace(node_dir / OWN_COPY)


def own_copy(node_dir: Path | None, step: int) -> Path | None:
    """The directory this node committed ``step`` from, where it is still there."""
    try:
        record = json.loads((node_dir / OWN_COPY).read_text()) if node_dir else None
    except (OSError, ValueError):
        return None
    directory = Path(record["dir"]) if record and record.get("step") == step else None
    return directory if directory and directory.is_dir() else None


def _copy_own(source: Path, want: dict, target: Path) -> bool:
    """Copies this node's own file where it is the committed one (size, then CRC32 on the way); False otherwise."""
    if not source.is_file() or source.stat().st_size != want["size"]:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(source, "rb") as f, open(target, "wb") as out:
        _, crc = _copy(f, out)
    if crc != want["crc32"]:
        target.unlink()
        return False
    return True


def _get(source: Location, want: dict, target: Path) -> int:
    """Streams one file down, checking its size and CRC32 against the marker's; bytes read."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with source.open_input() as f, open(target, "wb") as out:
        size, crc = _copy(f, out)
    if (size, crc) != (want["size"], want["crc32"]):
        raise CheckpointError(f"{source.url} is corrupted: {size} bytes CRC32 {crc:08x}, {COMMIT_MARKER} records "
                              f"{want['size']} bytes CRC32 {want['crc32']:08x}")
    return size


def _replace(local_dir: Path, staging: Path) -> None:
    """``local_dir`` becomes ``staging``; an earlier restore's directory is replaced, a user's own never is."""
    if local_dir.exists():
        if any(local_dir.iterdir()) and not (local_dir / RESTORED_MARK).exists():
            shutil.rmtree(staging, ignore_errors=True)
            raise SpotrayError(f"spotray.restore: {local_dir} is not empty: give a new or empty directory (files "
                               "there would mix with the checkpoint's)")
        shutil.rmtree(local_dir)
    shutil.move(staging, local_dir)  # a rename, or a copy where the prefetch's folder is on another disk


def _check_space(local_dir: Path, nbytes: int) -> None:
    local_dir.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(local_dir.parent).free
    if free < DISK_HEADROOM * nbytes:
        raise SpotrayError(f"{local_dir.parent} has {free / 2**30:.1f} GiB free, the checkpoint needs "
                           f"{nbytes / 2**30:.1f} GiB: give script.local_dir (or $SPOTRAY_LOCAL_DIR) a larger disk")

