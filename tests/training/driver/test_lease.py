"""One driver a run: a second driver of a run that a live one trains is refused in one line naming the holder; a
driver that is gone (its process, or on another host its renewals) leaves the run to the next."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil
import pytest

from spotray.accounts import endings
from spotray.driver import lease
from spotray.driver.lease import STALE_S, DriverLease, check_free
from spotray.errors import SpotrayError
from spotray.storage import Location, resolve


@pytest.fixture
def other_driver():
    """A live process on this host, as another driver would be."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def attempts(tmp_path) -> Location:
    return resolve(str(tmp_path / "run" / "attempts"))


def hold(attempts: Location, pid: int, host: str | None = None, renewed_ago_s: float = 1.0) -> None:
    """The ledger's driver record as the driver of process ``pid`` writes it."""
    endings.driver_renewed(attempts, {
        "started_at": time.time() - 60, "ended": False, "owner": "other", "host": host or lease.socket.gethostname(),
        "pid": pid, "process_started_at": psutil.Process(pid).create_time() if host is None else 0.0,
        "renewed_at": time.time() - renewed_ago_s})


def written(attempts: Location) -> dict:
    record = endings.driver_record(attempts)
    assert record is not None
    return record


def test_a_live_driver_on_this_host_keeps_the_run_and_the_refusal_names_it(attempts, other_driver):
    hold(attempts, other_driver.pid, renewed_ago_s=500)  # renewals do not matter where the process can be asked
    with pytest.raises(SpotrayError) as refused:
        check_free(attempts, "r")
    message = str(refused.value)
    assert message.startswith(f"run 'r' at {attempts.parent().url} is being trained by another driver (pid "
                              f"{other_driver.pid} on ")
    assert message.endswith("seen 500 s ago): stop it or let it end, or give another run.name"), message


def test_a_driver_whose_process_is_gone_or_that_recorded_its_end_leaves_the_run_to_the_next(attempts, other_driver):
    hold(attempts, other_driver.pid)
    other_driver.kill()
    other_driver.wait()
    check_free(attempts, "r")
    started = DriverLease(attempts, "r").start(None)
    started.stop()
    endings.driver_ended(attempts, None, None, "")
    check_free(attempts, "r")


def test_a_driver_on_another_host_that_stopped_renewing_long_ago_leaves_the_run_at_once(attempts, capsys):
    hold(attempts, 7, host="ray-head-x7k2p", renewed_ago_s=STALE_S + 1)
    check_free(attempts, "r")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("renews", [True, False])
def test_a_driver_on_another_host_keeps_the_run_if_it_renews_while_the_next_one_waits(attempts, monkeypatch, capsys,
                                                                                       renews):
    """A RayJob retry's new cluster may start its driver before the lost cluster's looks gone: it waits that out."""
    monkeypatch.setattr(lease, "STALE_S", 1.0)
    hold(attempts, 7, host="ray-head-x7k2p", renewed_ago_s=0)
    if renews:
        threading.Timer(0.3, hold, (attempts, 7), {"host": "ray-head-x7k2p", "renewed_ago_s": 0}).start()
        with pytest.raises(SpotrayError, match=r"\(pid 7 on ray-head-x7k2p, started .* seen [01] s ago\): stop it or "
                                               r"let it end, or give another run\.name$"):
            check_free(attempts, "r")
    else:
        check_free(attempts, "r")
    assert capsys.readouterr().err == ("spotray: run 'r' was trained by a driver on ray-head-x7k2p seen 0 s ago: "
                                       "waiting up to 1 s for it to renew its record or be gone\n")


def test_the_driver_renews_its_record_while_it_runs_and_not_after_it_stopped(attempts, monkeypatch):
    monkeypatch.setattr(lease, "RENEW_S", 0.05)
    held = DriverLease(attempts, "r").start(None)
    first = written(attempts)["renewed_at"]
    time.sleep(0.3)
    assert written(attempts)["renewed_at"] > first
    held.stop()
    endings.driver_ended(attempts, None, None, "")
    time.sleep(0.2)
    assert endings.driver_has_ended(attempts)  # a renewal after the end would undo it


def test_a_record_another_driver_took_is_not_renewed(attempts, other_driver, caplog):
    held = DriverLease(attempts, "r").start(None)
    hold(attempts, other_driver.pid)  # as a rerun elsewhere does once this driver's renewals looked stopped
    assert held.renew_once() is False
    held.stop()
    assert written(attempts)["owner"] == "other"
    assert f"run 'r' was taken by another driver (pid {other_driver.pid} on " in caplog.text
