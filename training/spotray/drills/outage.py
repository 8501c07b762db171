"""A storage outage on loopback: a TCP forwarder in front of a real endpoint whose link can be cut and restored."""

from __future__ import annotations

import socket
import struct
import threading
from urllib.parse import urlparse


class OutageProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream``; while cut, every connection is reset, open ones included."""

    def __init__(self, upstream_url: str):
        parsed = urlparse(upstream_url)
        self.upstream = (parsed.hostname, parsed.port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._down = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.forwarded = self.refused = 0  # connections, for drills to show that the outage was felt
        threading.Thread(target=self._accept_loop, daemon=True, name="outage-proxy").start()

    def cut(self) -> None:
        self._down.set()
        with self._lock:
            for sock in list(self._open):
                _reset(sock)
            self._open.clear()

    def restore(self) -> None:
        self._down.clear()

    def close(self) -> None:
        self.cut()
        self._listener.close()

    def __enter__(self) -> OutageProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self._down.is_set():
                self.refused += 1
                _reset(client)
                continue
            self.forwarded += 1
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                _reset(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._open.update((client, server))
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(1 << 16):
                dst.sendall(chunk)
        except OSError:
            pass
        for sock in (src, dst):
            with self._lock:
                self._open.discard(sock)
            _reset(sock)


def _reset(sock: socket.socket) -> None:
    """Close with RST, as a dropped link looks to the peer."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()
