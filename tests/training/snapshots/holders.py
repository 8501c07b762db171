"""In-process stand-ins for the snapshot holders (``memfs.Holder``), and the snapshot root a rank sees over them."""

from __future__ import annotations

import pyarrow.fs as pafs

from spotray.snapshots.holders import EVERYWHERE
from spotray.snapshots.memfs import HolderFileSystem, HolderFull, HolderGone, HolderRing, under
from spotray.storage import Location


class FakeHolder:
    """One node's memory; ``gone`` once its node is lost; ``cap`` bytes at most."""

    def __init__(self, node: str, cap: int = 1 << 30):
        self.node, self.cap, self.gone = node, cap, False
        self.files: dict[str, bytes] = {}
        self.gets: list[str] = []

    def put(self, path: str, data: bytes) -> None:
        self._answer()
        if sum(len(v) for k, v in self.files.items() if k != path) + len(data) > self.cap:
            raise HolderFull(self.node, f"the snapshot holder on node {self.node} refused {path}: no room")
        self.files[path] = bytes(data)

    def get(self, path: str) -> bytes | None:
        self._answer()
        self.gets.append(path)
        return self.files.get(path)

    def sizes(self, prefix: str) -> dict[str, int]:
        self._answer()
        return {k: len(v) for k, v in self.files.items() if under(k, prefix)}

    def delete(self, prefix: str) -> None:
        self._answer()
        for key in [k for k in self.files if under(k, prefix)]:
            del self.files[key]

    def move(self, src: str, dest: str) -> None:
        self._answer()
        for key in [k for k in self.files if under(k, src)]:
            self.files[dest + key[len(src):]] = self.files.pop(key)

    def usage(self) -> tuple[int, int]:
        self._answer()
        return sum(len(v) for v in self.files.values()), self.cap

    def _answer(self) -> None:
        if self.gone:
            raise HolderGone(f"node {self.node} is gone")


def snapshot_location(holders: list[FakeHolder], own: int = 0, machines: dict[str, str] | None = None) -> Location:
    ring = HolderRing(list(holders), own, EVERYWHERE, machines)
    return Location("snapshot://run", pafs.PyFileSystem(HolderFileSystem(ring)), "run")
