"""The driver's thread that logs the run to its trackers, read from the ledger beside the ``ProgressMonitor``.

Workers know nothing of it: they write the ledger as always, and a tracker, reachable or not, never slows a step."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable

from spotray.accounts import ledger
from spotray.config import TrainConfig
from spotray.errors import SpotrayError
from spotray.storage import Location
from spotray.tracking import state as tracking_state
from spotray.tracking.channel import MAX_PENDING_POINTS, RETRY_FOR_S, Channel, Sink
from spotray.tracking.feed import LedgerFeed, Snapshot, flat_params, summary_scalars
from spotray.tracking.libraries import configured
from spotray.tracking.mlflow_sink import MlflowSink
from spotray.tracking.state import Cursor
from spotray.tracking.tensorboard_sink import TensorboardSink
from spotray.tracking.wandb_sink import WandbSink

log = logging.getLogger(__name__)

POLL_S = 5.0


class Follower:
    """Context manager around the run's ``fit``: polls the ledger every ``poll_s`` and sends each configured
    tracker what it lacks. On a clean exit it makes a final pass, waiting for a tracker that cannot be reached until
    its outage has lasted ``retry_for_s``, and ``finish(summary)`` follows. On an exception it makes one best-effort
    pass and leaves the tracker runs for a rerun to continue. A tracker whose call never returns holds nothing up:
    the run ends after the same bound, saying so."""

    def __init__(self, cfg: TrainConfig, run_root: Location, stream=None, poll_s: float = POLL_S,
                 retry_for_s: float = RETRY_FOR_S, max_pending_points: int = MAX_PENDING_POINTS):
        self.run_root, self.stream, self.poll_s, self.retry_for_s = run_root, stream or sys.stderr, poll_s, retry_for_s
        names = configured(cfg.tracking)
        self.state = tracking_state.load(run_root) if names else tracking_state.TrackingState()
        self.channels = [Channel(name, *_tracker(cfg, name, run_root), self.state, self._warn, retry_for_s,
                                 max_pending_points) for name in names]
        self.feed = LedgerFeed(ledger.attempts_root(run_root), cfg.train.log_every)
        # A script's run is complete when the script returns: it may train any number of steps.
        self.params, self.max_steps = flat_params(cfg.to_dict()), None if cfg.script.path else cfg.train.max_steps
        self._saved = self.state.to_json()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="spotray-tracking")
        self._feeding: str | None = None  # the tracker being sent to, or last sent to
        self.stuck: str | None = None  # the tracker whose call had not returned when the run ended

    def __enter__(self) -> Follower:
        if self.channels:
            self._thread.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if not self.channels:
            return
        self._stop.set()
        self._thread.join(timeout=self.retry_for_s + self.poll_s)
        if self._thread.is_alive():  # a tracker's call never returned: the run does not wait for it
            self.stuck = self._feeding
            self._warn(f"tracking.{self.stuck}: a call to the tracker has not returned in "
                       f"{self.retry_for_s + self.poll_s:g} s; the run ends without waiting for it, and a rerun "
                       "sends the tracker what it lacks")
            return
        if exc_type is None:
            self._settle()
            return
        self.poll(final=True)
        for channel in self.channels:
            channel.close()
        self._save()

    def finish(self, summary: dict) -> None:
        """After a clean exit: a run trained to ``train.max_steps`` is finished; one that stopped short of it
        (``train.stop_at_step``) is left for a rerun to continue, as after a failure."""
        if self.stuck:
            return
        for channel in self.channels:
            if self.max_steps is None or summary["final_step"] >= self.max_steps:
                channel.finish(summary_scalars(summary))
            else:
                channel.close()
        self._save()

    def poll(self, final: bool = False) -> bool:
        """One pass over the ledger; True when every tracker holds all of it."""
        snapshot = self._snapshot(final)
        if snapshot is None:
            return False
        done = []
        for channel in self.channels:
            self._feeding = channel.name
            done.append(channel.feed(snapshot, self.params, time.time()))
        self._save()
        return all(done)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def _settle(self) -> None:
        """The final pass, tried again while a tracker's outage is within its retry bound (one down for longer is not
        waited for: the run's nodes would idle for nothing); what is still unsent is then dropped into a gap."""
        if self.poll(final=True):
            return
        down = {channel.key: channel.failing_since for channel in self.channels if channel.failing_since is not None}
        deadline = max(down.values(), default=time.time()) + self.retry_for_s
        if down and deadline > time.time():
            self._warn(f"{', '.join(down)} still down as the run ends: waiting up to {deadline - time.time():.0f} s "
                       f"more (until its outage has lasted {self.retry_for_s:g} s), then what it lacks is dropped")
        while time.time() < deadline:
            time.sleep(self.poll_s)
            if self.poll(final=True):
                return
        if (snapshot := self._snapshot(final=True)) is not None:
            for channel in self.channels:
                channel.give_up(snapshot)
            self._save()

    def _snapshot(self, final: bool) -> Snapshot | None:
        try:
            return self.feed.snapshot(final)
        except (SpotrayError, OSError, ValueError, KeyError) as exc:
            log.info("tracking: cannot read the ledger yet: %s", exc)  # a storage hiccup: the next poll catches up
            return None

    def _save(self) -> None:
        text = self.state.to_json()
        if text == self._saved:
            return
        try:
            tracking_state.state_location(self.run_root).write_text(text)
            self._saved = text
        except SpotrayError as exc:
            log.info("tracking: cannot write %s yet: %s", tracking_state.STATE_FILE, exc)

    def _warn(self, text: str) -> None:
        self.stream.write(f"spotray: warning: {text}\n")
        self.stream.flush()


def _tracker(cfg: TrainConfig, name: str, run_root: Location) -> tuple[str, Callable[[Cursor], Sink]]:
    """Where a tracker sends to (for its warning), and how to open its run."""
    section, run_name = getattr(cfg.tracking, name), cfg.run.name
    if name == "mlflow":
        return section.uri, lambda cursor: MlflowSink(section, cursor, run_name, run_root.url)
    if name == "wandb":
        return f"W&B project {section.project}", lambda cursor: WandbSink(section, cursor, run_name, run_root)
    return section.dir, lambda cursor: TensorboardSink(section, cursor, run_name, run_root)
