"""A pyarrow file system whose files live in the memory of holders on the run's nodes, so that the checkpoint code
(DCP writer and reader, commit marker, checksums) writes and reads snapshots exactly as it does checkpoints.

Each file is written to the holders ``HolderRing.targets`` names (the writer's own node and the next one in the
ring, or every node for the small files that say what a snapshot holds) and read from the first holder that has
it, the writer's own node first. A holder that does not answer (its node is gone) has nothing."""

from __future__ import annotations

import io
import itertools
import posixpath
from collections.abc import Iterable, Mapping
from typing import Protocol

import pyarrow as pa
import pyarrow.fs as pafs


class Holder(Protocol):
    """One node's snapshot memory. ``put`` raises ``HolderFull`` where the holder refuses (no room); every call
    raises ``HolderGone`` where it is gone."""

    node: str

    def put(self, path: str, data: bytes) -> None: ...

    def get(self, path: str) -> bytes | None: ...

    def sizes(self, prefix: str) -> dict[str, int]: ...

    def delete(self, prefix: str) -> None: ...

    def move(self, src: str, dest: str) -> None: ...

    def usage(self) -> tuple[int, int]: ...


class HolderGone(OSError):
    """A holder did not answer: its node is gone, and its files with it."""


class HolderFull(OSError):
    """A holder refused a file: its node has no room for it."""

    def __init__(self, node: str, message: str):
        super().__init__(message)
        self.node = node


class HolderRing:
    """The holders a rank writes to and reads from. ``ring``: one holder per node, in ring order; ``own``: the
    index of this rank's node; ``everywhere``: file names every holder gets; ``machines``: the machine each node
    (``Holder.node``) runs on, where several share one (Kubernetes pods on one instance, which a spot interruption
    takes whole); a node missing is its own machine. A file's second copy goes to the next node on another machine
    where there is one. A node ``excluded`` for want of room holds nothing: its ranks' files go to the next two nodes
    that hold, so that losing any one node still leaves a copy. ``refused``: the nodes that refused this rank a file
    since the ring was last told (``exclude``)."""

    def __init__(self, ring: list[Holder], own: int, everywhere: frozenset[str],
                 machines: Mapping[str, str] | None = None):
        if not ring:
            raise ValueError("a snapshot ring needs at least one holder")
        self.ring, self.own, self.everywhere = ring, own, everywhere
        self.machines = dict(machines or {})
        self.excluded: set[str] = set()
        self.refused: set[str] = set()

    def targets(self, path: str) -> list[Holder]:
        holding = [holder for holder in self.readers() if holder.node not in self.excluded]
        if posixpath.basename(path) in self.everywhere or not holding:
            return holding
        first, rest = holding[0], holding[1:]
        elsewhere = [holder for holder in rest if self._machine(holder) != self._machine(first)]
        return [first, *(elsewhere or rest)[:1]]

    def _machine(self, holder: Holder) -> str:
        return self.machines.get(holder.node, holder.node)

    def exclude(self, nodes: set[str]) -> bool:
        """Stops writing to ``nodes``; False (and nothing changes) where no node would be left to hold."""
        self.refused.clear()
        if not {holder.node for holder in self.ring} - self.excluded - nodes:
            return False
        self.excluded |= nodes
        return True

    def readers(self) -> list[Holder]:
        """This rank's node first, then the others in ring order."""
        return self.ring[self.own:] + self.ring[:self.own]


class HolderFileSystem(pafs.FileSystemHandler):
    """pyarrow's file system seam over a ``HolderRing``: flat keys, directories implied by them."""

    def __init__(self, holders: HolderRing):
        self.holders = holders

    def get_type_name(self) -> str:
        return "spotray-snapshots"

    def equals(self, other) -> bool:
        return other is self

    def normalize_path(self, path: str) -> str:
        return path.rstrip("/")

    def get_file_info(self, paths: Iterable[str]) -> list[pafs.FileInfo]:
        listed = self._sizes("")
        return [self._info(path.rstrip("/"), listed) for path in paths]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        base = selector.base_dir.rstrip("/")
        listed = self._sizes(base)
        if not listed and not selector.allow_not_found:
            raise FileNotFoundError(base)
        entries: dict[str, pafs.FileInfo] = {}
        for key, size in listed.items():
            parts = posixpath.relpath(key, base).split("/")
            depth = len(parts) if selector.recursive else 1
            for level in range(1, min(depth, len(parts)) + 1):
                path = posixpath.join(base, *parts[:level])
                is_file = level == len(parts)
                entries[path] = pafs.FileInfo(path, pafs.FileType.File if is_file else pafs.FileType.Directory,
                                              size=size if is_file else None)
        return list(entries.values())

    def create_dir(self, path: str, recursive: bool) -> None:
        pass  # directories exist as their files' prefixes

    def delete_dir(self, path: str) -> None:
        self._delete(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._delete(path)

    def delete_root_dir_contents(self) -> None:
        self._delete("")

    def delete_file(self, path: str) -> None:
        self._delete(path)

    def move(self, src: str, dest: str) -> None:
        for holder in self.holders.ring:
            holder.move(src.rstrip("/"), dest.rstrip("/"))

    def copy_file(self, src: str, dest: str) -> None:
        raise NotImplementedError("snapshot files are never copied")

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.open_input_file(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        for holder in self.holders.readers():
            try:
                data = holder.get(path)
            except HolderGone:
                continue
            if data is not None:
                return pa.BufferReader(data)
        raise FileNotFoundError(path)

    def open_output_stream(self, path: str, metadata) -> pa.NativeFile:
        return pa.PythonFile(_Upload(self.holders, path), mode="w")

    def open_append_stream(self, path: str, metadata) -> pa.NativeFile:
        raise NotImplementedError("snapshot files are written whole")

    def usage(self) -> dict[str, tuple[int, int]]:
        """Each answering node's bytes held and the most it may hold."""
        held = {}
        for holder in self.holders.ring:
            try:
                held[holder.node] = holder.usage()
            except HolderGone:
                continue
        return held

    def _sizes(self, prefix: str) -> dict[str, int]:
        listed: dict[str, int] = {}
        for holder in self.holders.ring:
            try:
                listed.update(holder.sizes(prefix))
            except HolderGone:
                continue
        return listed

    def _delete(self, prefix: str) -> None:
        for holder in self.holders.ring:
            try:
                holder.delete(prefix.rstrip("/"))
            except HolderGone:
                continue

    @staticmethod
    def _info(path: str, listed: dict[str, int]) -> pafs.FileInfo:
        if path in listed:
            return pafs.FileInfo(path, pafs.FileType.File, size=listed[path])
        inside = f"{path}/" if path else ""
        if any(key.startswith(inside) for key in listed):
            return pafs.FileInfo(path, pafs.FileType.Directory)
        return pafs.FileInfo(path, pafs.FileType.NotFound)


class _Upload(io.BytesIO):
    """A file being written: it reaches its holders whole when closed, as an object reaches S3."""

    def __init__(self, holders: HolderRing, path: str):
        super().__init__()
        self.holders, self.path = holders, path

    def close(self) -> None:
        if self.closed:
            return
        try:
            data = self.getvalue()
            for holder in self.holders.targets(self.path):
                try:
                    holder.put(self.path, data)
                except HolderFull:
                    self.holders.refused.add(holder.node)
                    raise
        finally:
            super().close()


def ring_order(machines: Mapping[str, str]) -> list[str]:
    """The nodes (``{node: machine}``) in ring order: one node of each machine in turn, so that each node's next one on
    another machine is also its next in the ring and no node holds more second copies than the machines' sizes force.
    Where every node is its own machine, the nodes sorted."""
    by_machine = [sorted(n for n, m in machines.items() if m == machine) for machine in sorted(set(machines.values()))]
    return [node for turn in itertools.zip_longest(*by_machine) for node in turn if node is not None]


def holder_ring(location) -> HolderRing | None:
    """The ring under a snapshot root; None for any other location."""
    handler = getattr(location.fs, "handler", None)
    return handler.holders if isinstance(handler, HolderFileSystem) else None


def holder_usage(location) -> dict[str, tuple[int, int]]:
    """What each node holds of a snapshot root's files, and the most it may; empty for any other location."""
    handler = getattr(location.fs, "handler", None)
    return handler.usage() if isinstance(handler, HolderFileSystem) else {}


def under(key: str, prefix: str) -> bool:
    """Whether ``key`` is ``prefix`` or inside it (every key is inside the empty prefix)."""
    return not prefix or key == prefix or key.startswith(f"{prefix}/")
