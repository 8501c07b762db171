"""How far each tracker has the run, kept in the run's storage (``<run_root>/tracking.json``): the tracker run ids
created at the run's first start, what was sent, and the gaps. Every later driver continues from it."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from spotray.storage import Location

STATE_FILE = "tracking.json"


@dataclass
class Cursor:
    """One tracker's run id and what it holds: the steps up to ``logged_step`` (sent, or dropped into a gap), the
    config, the first ``events`` interruptions, and the summary of the run finished at ``summary_step``."""

    run_id: str | None = None
    logged_step: int = 0
    params: bool = False
    events: int = 0
    summary_step: int = 0


@dataclass
class TrackingState:
    cursors: dict[str, Cursor] = field(default_factory=dict)
    gaps: list[dict] = field(default_factory=list)  # {tracker, first_step, last_step, points}: points dropped

    def cursor(self, tracker: str) -> Cursor:
        return self.cursors.setdefault(tracker, Cursor())

    def to_json(self) -> str:
        cursors = {name: dataclasses.asdict(cursor) for name, cursor in self.cursors.items()}
        return json.dumps({"trackers": cursors, "gaps": self.gaps}, indent=1, sort_keys=True)


def state_location(run_root: Location) -> Location:
    return run_root.child(STATE_FILE)


def load(run_root: Location) -> TrackingState:
    location = state_location(run_root)
    if not location.exists():
        return TrackingState()
    raw = json.loads(location.read_text())
    return TrackingState({name: Cursor(**cursor) for name, cursor in raw["trackers"].items()}, raw["gaps"])


def read_gaps(run_root: Location) -> list[dict]:
    """The points the trackers never got, over every driver of the run (the summary's ``tracking_gaps``)."""
    return load(run_root).gaps
