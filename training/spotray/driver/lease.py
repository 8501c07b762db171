"""One driver a run. A second ``spotray train`` of a run that a live driver trains would resume from the same step,
remove the first one's snapshots, end its attempt as lost, and overwrite its checkpoints and ledger; it is refused in
one line instead (``check_free``, in the preflight). The driver's record in the ledger (``endings.DRIVER_FILE``) names
its process and host while it runs and is renewed every ``RENEW_S``; a holder on this host is alive while its process
is, one elsewhere while it renewed within ``STALE_S`` (a killed driver's rerun on another host waits out the rest).

Object stores have no lock that both local folders and S3 offer, so two drivers started within the same second may
both pass; the refusal is for the mistake people make (a second terminal, a job submitted twice), not a lock."""

from __future__ import annotations

import logging
import os
import socket
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
    ledger is ``attempts``."""
    now = time.time()
    held = _holder(attempts)
    if held is None or not _alive(held, now):
        return
    seen = max(0.0, now - held["renewed_at"])
    started = time.strftime("%H:%M:%S UTC", time.gmtime(held["started_at"]))
    wait = "" if held["host"] == socket.gethostname() else \
        f"; if it is gone, this command can run in {max(1.0, STALE_S - seen):.0f} s"
    raise SpotrayError(f"run '{run_name}' at {attempts.parent().url} is being trained by another driver (pid "
                       f"{held['pid']} on {held['host']}, started {started}, seen {seen:.0f} s ago): stop it or let "
                       f"it end, or give another run.name{wait}")


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
