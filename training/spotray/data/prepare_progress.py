"""The live line of a prepare: documents, tokens, MB/s and ETA; rewritten in place on a terminal, one line every
few seconds in a log."""

from __future__ import annotations

import sys
import time

from spotray.formats import clock

TTY_INTERVAL_S = 0.5


class PrepareProgress:
    def __init__(self, total_bytes: int, stream=None, log_interval_s: float = 5.0):
        self.total_bytes = total_bytes
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval_s = TTY_INTERVAL_S if self.tty else log_interval_s
        self.started = time.monotonic()
        self.done = (0, 0, 0)  # documents, tokens, bytes of the chunks finished
        self._last_print = 0.0
        self._shown = False

    def chunk_done(self, documents: int, tokens: int, bytes_in: int) -> None:
        self.done = (self.done[0] + documents, self.done[1] + tokens, self.done[2] + bytes_in)

    def update(self, documents: int, tokens: int, bytes_in: int) -> None:
        """Called with the counts of the chunks still running; prints when the interval has passed."""
        now = time.monotonic()
        if now - self._last_print < self.interval_s:
            return
        self._last_print = now
        line = self.line(self.done[0] + documents, self.done[1] + tokens, self.done[2] + bytes_in, now)
        if self.tty:
            self.stream.write(f"\r{line}\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._shown = True

    def line(self, documents: int, tokens: int, bytes_in: int, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = bytes_in / elapsed
        parts = [f"prepare: {documents:,} docs", f"{tokens:,} tokens", f"{rate / 1e6:.1f} MB/s",
                 f"{100 * bytes_in / max(self.total_bytes, 1):.0f}%"]
        if rate > 0 and bytes_in < self.total_bytes:
            parts.append(f"ETA {clock((self.total_bytes - bytes_in) / rate)}")
        return " | ".join(parts)

    def close(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\n")
            self.stream.flush()
