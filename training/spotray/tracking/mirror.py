"""A tracker's local files copied beside a run that lives on S3, as the run log is: now and then, and at the end."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from spotray.errors import SpotrayError
from spotray.storage import UPLOAD_EVERY_S, Location

log = logging.getLogger(__name__)


class Mirror:
    """Uploads the files under ``local`` that changed since their last upload to ``dest``, keeping their paths."""

    def __init__(self, local: Path, dest: Location):
        self.local, self.dest = local, dest
        self._uploaded: dict[Path, tuple[int, int]] = {}  # path -> (size, mtime) when it was uploaded
        self._last = -UPLOAD_EVERY_S

    def sync(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last < UPLOAD_EVERY_S:
            return
        self._last = time.monotonic()
        for path in sorted(self.local.rglob("*")):
            if path.is_symlink() or not path.is_file():
                continue
            stat = path.stat()
            if self._uploaded.get(path) == (stat.st_size, stat.st_mtime_ns):
                continue
            try:
                self.dest.child(path.relative_to(self.local).as_posix()).put_file(str(path))
            except SpotrayError as exc:  # storage outage: the next sync tries again
                log.info("could not upload %s to %s: %s", path, self.dest.url, exc)
                return
            self._uploaded[path] = (stat.st_size, stat.st_mtime_ns)


def local_dir(run_root: Location, name: str) -> tuple[Path, Mirror | None]:
    """Where a tracker writes its files for the run: ``<run_root>/<name>`` for a local run; for a run on S3 a
    directory ``name`` in a temporary one, mirrored there."""
    if not run_root.is_s3:
        return Path(run_root.child(name).path), None
    local = Path(tempfile.mkdtemp(prefix="spotray-")) / name
    return local, Mirror(local, run_root.child(name))
