"""The terminal of a ``spotray train``: spotray's own lines there, the rest of what the process prints (Ray's
driver, the workers' output that Ray streams to the driver, tracebacks) in the run's log file.

While a ``RunConsole`` is open, file descriptors 1 and 2 of this process feed a pipe that a thread copies into the
log file; ``stream`` still writes to the terminal. Warnings and errors that spotray's workers log are shown on the
terminal once each (``WORKER_FORMAT`` marks them); ``verbose`` echoes everything instead.
"""

from __future__ import annotations

import logging
import os
import re
import select
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TextIO

from spotray.storage import UPLOAD_EVERY_S, Location

WORKER_FORMAT = "spotray %(levelname)s: %(message)s"
_WORKER_NEEDS_USER = re.compile(r"spotray (WARNING|ERROR|CRITICAL): (.*?)(?:\s*\[repeated \d+x across cluster\])?\s*$")
_COLOR = re.compile(r"\x1b\[[0-9;]*m")
_LONGEST_LINE = 1 << 20

class RunConsole:
    """Context manager; ``log`` is where the log file goes (local: written there as it grows; ``s3://``: a local
    file uploaded there every ``UPLOAD_EVERY_S`` and when the run ends)."""

    def __init__(self, log: Location, verbose: bool = False):
        self.log, self.verbose = log, verbose
        self.local_path = self._local_path()
        self.stream: TextIO | None = None  # the terminal, from __enter__ on
        self._seen: set[str] = set()
        self._partial = b""
        self._uploaded_size = 0
        self._last_upload = time.monotonic()
        self._handler: logging.Handler | None = None

    @property
    def where(self) -> str:
        """The log file, as the header names it."""
        if not self.log.is_s3:
            return self.local_path
        return f"{self.log.url} (uploaded every {UPLOAD_EVERY_S:.0f} s; meanwhile {self.local_path})"

    @property
    def _terminal(self) -> TextIO:
        assert self.stream is not None, "the console writes to the terminal inside its with block only"
        return self.stream

    def say(self, line: str) -> None:
        self._terminal.write(f"spotray: {line}\n")
        self._terminal.flush()

    def __enter__(self) -> RunConsole:
        self._file = open(self.local_path, "ab", buffering=0)  # noqa: SIM115 - closed in __exit__
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = os.dup(1), os.dup(2)
        self.stream = os.fdopen(os.dup(self._saved[1]), "w", buffering=1)
        read_fd, self._write_fd = os.pipe()
        os.dup2(self._write_fd, 1)
        os.dup2(self._write_fd, 2)
        self._streams = sys.stdout, sys.stderr  # objects that may not write to 1 and 2 (a test's capture)
        sys.stdout = sys.stderr = open(self._write_fd, "w", buffering=1, closefd=False)  # noqa: SIM115
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._pump, args=(read_fd,), daemon=True, name="spotray-log")
        self._thread.start()
        if not self.verbose:
            self._handler = _ConsoleHandler(self)
            logging.getLogger("spotray").addHandler(self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._handler:
            logging.getLogger("spotray").removeHandler(self._handler)
        sys.stdout.close()
        sys.stdout, sys.stderr = self._streams
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in (*self._saved, self._write_fd):
            os.close(fd)
        self._closing.set()
        self._thread.join(timeout=10)
        self._file.close()
        if self.log.is_s3:
            self._upload()
            if self._uploaded_size == os.path.getsize(self.local_path):  # the bucket's copy is whole: no local one
                shutil.rmtree(os.path.dirname(self.local_path), ignore_errors=True)
        self._terminal.close()

    def _local_path(self) -> str:
        if not self.log.is_s3:
            try:
                Path(self.log.path).parent.mkdir(parents=True, exist_ok=True)
                return self.log.path
            except OSError:
                pass  # a read-only checkpoint directory: the log goes to the temporary directory instead
        return str(Path(tempfile.mkdtemp(prefix="spotray-log-")) / self.log.name)

    def _pump(self, read_fd: int) -> None:
        """Copies the pipe into the log file until every writer is gone, or until a lingering one (a process this
        one started) goes quiet after the console closed."""
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while True:
                if select.select([pipe], [], [], 0.2)[0]:
                    chunk = pipe.read(1 << 16)
                    if not chunk:
                        break
                    self._take(chunk)
                elif self._closing.is_set():
                    break
                if self.log.is_s3 and time.monotonic() - self._last_upload > UPLOAD_EVERY_S:
                    self._upload()
        if self._partial:
            self._line(_COLOR.sub("", self._partial.decode(errors="replace")))

    def _take(self, chunk: bytes) -> None:
        """The log file gets whole lines without colour codes; the terminal, in verbose mode, gets them as they
        come."""
        if self.verbose:
            self._terminal.write(chunk.decode(errors="replace"))
            self._terminal.flush()
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        if len(self._partial) > _LONGEST_LINE:  # a progress bar redrawn with carriage returns, never ending a line
            lines.append(self._partial)
            self._partial = b""
        for line in lines:
            self._line(_COLOR.sub("", line.decode(errors="replace")))

    def _line(self, line: str) -> None:
        self._file.write(f"{line}\n".encode())
        match = None if self.verbose else _WORKER_NEEDS_USER.search(line)
        if match:
            self.once(f"{match[1].lower()}: {match[2]}")

    def once(self, text: str) -> None:
        """One terminal line per distinct text: every rank may log the same warning."""
        if text not in self._seen:
            self._seen.add(text)
            self.say(text)

    def _upload(self) -> None:
        self._last_upload = time.monotonic()
        size = os.path.getsize(self.local_path)
        if size == self._uploaded_size:
            return
        try:
            self.log.put_file(self.local_path)
            self._uploaded_size = size
        except Exception as exc:  # noqa: BLE001 - a storage hiccup must not end the run; the file stays local
            self.once(f"warning: could not upload the log to {self.log.url} ({exc}); it is at {self.local_path}")


class _ConsoleHandler(logging.Handler):
    """spotray's own warnings on the driver, on the terminal as well as in the log file."""

    def __init__(self, console: RunConsole):
        super().__init__(logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        self.console.once(f"{record.levelname.lower()}: {record.getMessage()}")
