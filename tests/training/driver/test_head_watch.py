"""The driver's watch on the Ray head: a head that stops answering interrupts the main thread once, after the
watch's wait; one that answers never does."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from spotray.driver.head_watch import _SIGNAL, HeadWatch, ray_reconnect_timeout_s


def test_a_head_that_stops_answering_interrupts_the_main_thread_after_the_wait():
    server = socket.create_server(("127.0.0.1", 0))
    host, port = server.getsockname()
    watch = HeadWatch(f"{host}:{port}", lost_after_s=0.5, every_s=0.05)
    with pytest.raises(KeyboardInterrupt), watch:
        time.sleep(0.3)
        assert not watch.lost  # answering
        server.close()
        closed = time.monotonic()
        time.sleep(10)
    assert watch.lost and time.monotonic() - closed >= 0.5
    assert signal.getsignal(_SIGNAL) is signal.SIG_DFL  # the handler it installed is gone


def test_a_head_that_answers_is_never_lost_and_no_address_watches_nothing():
    with socket.create_server(("127.0.0.1", 0)) as server:
        host, port = server.getsockname()
        with HeadWatch(f"{host}:{port}", lost_after_s=0.2, every_s=0.05) as watch:
            time.sleep(0.6)
        assert not watch.lost and watch.answers()
    with HeadWatch(None, lost_after_s=0.1, every_s=0.05) as nothing:
        time.sleep(0.3)
    assert not nothing.lost and nothing.answers()


def test_the_wait_is_half_of_rays_own_reconnect_timeout(monkeypatch):
    monkeypatch.setenv("RAY_gcs_rpc_server_reconnect_timeout_s", "40")
    assert ray_reconnect_timeout_s() == 40 and HeadWatch("127.0.0.1:1").lost_after_s == 20
    monkeypatch.delenv("RAY_gcs_rpc_server_reconnect_timeout_s")
    assert HeadWatch("127.0.0.1:1").lost_after_s == 30
