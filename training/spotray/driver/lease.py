"""One driver a run. A second ``spotray train`` of a run that a live driver trains would resume from the same step,
remove the first one's snapshots, end its attempt as lost, and overwrite its checkpoints and ledger; it is refused in
one line instead (``check_free``, in the preflight). The driver's record in the ledger (``endings.DRIVER_FILE``) names
its process and host while it runs and is renewed every ``RENEW_S``; a holder on this host is alive while its process
is, one elsewhere while it renews: a driver that sees one renewed within ``STALE_S`` waits out the rest, refused as
soon as it sees a renewal (a RayJob retry's new cluster may start before the lost one's driver looks gone).

Object stores have no lock that both local folders and S3 offer, so two drivers started within the same second may
both pass; the refusal is for the mistake people make (a second terminal, a job submitted twice), not a lock."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import uuid

import psutil

from spotray.accounts import endings
from spotray.errors import SpotrayError
from spotray.storage import Location

RENEW_S = 10.0
STALE_S = 3 * RENEW_S
_HOLDER_KEYS = frozenset({"owner", "host", "pid", "process_started_at", "renewed_at"})

log = logging.getLogger(__name__)


def check_free(attempts: Location, run_name: str) -> None:
    """Raises, naming the holder and what to do, where a live driver other than this process trains the run whose
    ledger is ``attempts``; waits up to ``STALE_S`` for one elsewhere to show whether it still renews."""
    held = _holder(attempts)
    if held is None or not _alive(held, time.time()):
        return
    if held["host"] != socket.gethostname() and (held := _renewal_seen(attempts, held, run_name)) is None:
        return
    started = time.strftime("%H:%M:%S UTC", time.gmtime(held["started_at"]))
    raise SpotrayError(f"run '{run_name}' at {attempts.parent().url} is being trained by another driver (pid "
                       f"{held['pid']} on {held['host']}, started {started}, {_seen(held)}): stop it or let it end, "
                       "or give another run.name")


class DriverLease:
    """This driver's record, from ``start`` (``endings.driver_started``) until ``stop``, renewed meanwhile."""

    def __init__(self, attempts: Location, run_name: str):
        self.attempts, self.run_name = attempts, run_name
        process = psutil.Process()
        self.holder = {"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": process.pid,
                       "process_started_at": process.create_time()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True, name="spotray-driver-lease")

    def start(self, newest_attempt: str | None) -> DriverLease:
        self._record = endings.driver_started(self.attempts, newest_attempt, {**self.holder, "renewed_at": time.time()})
        self._thread.start()
        return self

    def stop(self) -> None:
        """Before the driver records its end: a renewal after it would undo it."""
        self._stop.set()
        self._thread.join()

    def renew_once(self) -> bool:
        """False once the record is no longer this driver's (another took the run while this one looked gone)."""
        try:
            held = _holder(self.attempts)
            if held is None or held["owner"] != self.holder["owner"]:
                log.warning("run '%s' was taken by another driver (%s) while this one did not renew its record",
                            self.run_name, f"pid {held['pid']} on {held['host']}" if held else "its record is gone")
                return False
            endings.driver_renewed(self.attempts, {**self._record, "renewed_at": time.time()})
        except (OSError, SpotrayError) as exc:  # an outage: the run goes on; a rerun elsewhere waits longer
            log.info("could not renew the driver's record in %s: %s", self.attempts.url, exc)
        return True

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S) and self.renew_once():
            pass


def _renewal_seen(attempts: Location, held: dict, run_name: str) -> dict | None:
    """Waits until the driver elsewhere that ``held`` names renews its record or another driver takes it (the newer
    record), or until it goes stale or is gone (None)."""
    print(f"spotray: run '{run_name}' was trained by a driver on {held['host']} {_seen(held)}: waiting up to "
          f"{_stale_in(held):.0f} s for it to renew its record or be gone", file=sys.stderr, flush=True)
    while _stale_in(held) > 0:
        time.sleep(min(RENEW_S / 4, _stale_in(held)))
        latest = _holder(attempts)
        if latest is None:
            return None
        if (latest["owner"], latest["renewed_at"]) != (held["owner"], held["renewed_at"]):
            return latest
    return None


def _seen(held: dict) -> str:
    return f"seen {max(0.0, time.time() - held['renewed_at']):.0f} s ago"


def _stale_in(held: dict) -> float:
    return max(0.0, held["renewed_at"] + STALE_S - time.time())


def _holder(attempts: Location) -> dict | None:
    """The running driver's record, where one that names its process has not recorded its end."""
    record = endings.driver_record(attempts)
    return record if record and not record.get("ended") and _HOLDER_KEYS <= set(record) else None


def _alive(held: dict, now: float) -> bool:
    if held["host"] != socket.gethostname():
        return now - held["renewed_at"] < STALE_S
    if held["pid"] == os.getpid():
        return False  # this process: a record an earlier run in it left, not another driver
    try:
        return abs(psutil.Process(held["pid"]).create_time() - held["process_started_at"]) < 1
    except psutil.Error:
        return False
