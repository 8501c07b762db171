"""TensorBoard: event files in ``<tracking.tensorboard.dir>/<run.name>``, the same directory for every driver of
the run. Each driver's writer starts with ``purge_step`` at the first step not yet logged, so TensorBoard discards
anything an earlier driver wrote past what the run's state records. A run on S3 gets the files mirrored to
``<run_root>/tensorboard``."""

from __future__ import annotations

from pathlib import Path

from spotray.accounts.goodput import resumed_point
from spotray.config import TensorboardSection
from spotray.formats import step_count
from spotray.storage import Location
from spotray.tracking.feed import Row
from spotray.tracking.mirror import Mirror
from spotray.tracking.state import Cursor


class TensorboardSink:
    logged_step: int | None = None  # event files cannot be asked: the run's state says

    def __init__(self, section: TensorboardSection, cursor: Cursor, run_name: str, run_root: Location):
        from torch.utils.tensorboard import SummaryWriter

        log_dir = Path(section.dir).absolute() / run_name
        self.writer = SummaryWriter(str(log_dir), purge_step=cursor.logged_step + 1 if cursor.logged_step else None)
        self.mirror = Mirror(log_dir, run_root.child("tensorboard")) if run_root.is_s3 else None

    def params(self, params: dict[str, str]) -> None:
        self.writer.add_text("config", markdown_table(params), 0)

    def rows(self, rows: list[Row]) -> None:
        for row in rows:
            for name, value in row.metrics.items():
                self.writer.add_scalar(name, value, row.step, walltime=row.time)

    def events(self, events: list[dict], new_from: int) -> None:
        for event in events[new_from:]:
            recovery = "-" if event["recovery_s"] is None else f"{event['recovery_s']} s"
            self.writer.add_text("endings", f"{event['kind']} at step {event['step']} ({event['reason']}): "
                                 f"{step_count(event['lost_steps'])} lost, resumed from "
                                 f"{resumed_point(event['resumed_from'], event['from_snapshot'])} after {recovery}",
                                 event["resumed_from"])  # a step already logged: no later purge_step reaches it

    def summary(self, scalars: dict) -> None:
        self.writer.add_text("summary", markdown_table(scalars), int(scalars.get("final_step", 0)))

    def flush(self) -> None:
        self.writer.flush()
        if self.mirror:
            self.mirror.sync()

    def close(self, finished: bool) -> None:
        self.writer.close()
        if self.mirror:
            self.mirror.sync(force=True)


def markdown_table(values: dict) -> str:
    return "\n".join(["| key | value |", "|---|---|", *(f"| {key} | {value} |" for key, value in values.items())])
