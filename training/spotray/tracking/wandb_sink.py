"""Weights & Biases: one run per spotray run, its id kept in the run's storage and resumed (``resume="allow"``).

W&B's own service process sends (online) or records (offline: ``wandb sync`` uploads later) what is logged, and
retries by itself; offline records of a run on S3 are mirrored to ``<run_root>/wandb``."""

from __future__ import annotations

import uuid
from typing import Literal, cast

from spotray.config import WandbSection
from spotray.storage import Location
from spotray.tracking.feed import Row
from spotray.tracking.mirror import local_dir
from spotray.tracking.state import Cursor

INIT_TIMEOUT_S = 30.0  # an unreachable server fails the open, which the follower retries at its next poll


class WandbSink:
    def __init__(self, section: WandbSection, cursor: Cursor, run_name: str, run_root: Location):
        import wandb

        cursor.run_id = cursor.run_id or uuid.uuid4().hex[:12]
        directory, mirror = local_dir(run_root, "wandb")  # W&B writes into <dir>/wandb
        self.mirror = mirror if section.mode == "offline" else None
        directory.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, x_disable_machine_info=True,
                                  save_code=False, disable_git=True, x_save_requirements=False,
                                  init_timeout=INIT_TIMEOUT_S)
        self.run = wandb.init(project=section.project, entity=section.entity, id=cursor.run_id, resume="allow",
                              mode=cast(Literal["online", "offline"], section.mode),  # one of WANDB_MODES
                              dir=str(directory.parent), name=run_name, settings=settings)
        self.logged_step = self.run.starting_step - 1 if self.run.resumed else None

    def params(self, params: dict[str, str]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def rows(self, rows: list[Row]) -> None:
        for row in rows:
            self.run.log(row.metrics, step=row.step)

    def events(self, events: list[dict], new_from: int) -> None:
        self.run.summary["endings"] = events
        self.run.summary["spot_interruptions"] = sum(1 for event in events if event["spot"])

    def summary(self, scalars: dict) -> None:
        self.run.summary.update(scalars)

    def flush(self) -> None:
        if self.mirror:
            self.mirror.sync()

    def close(self, finished: bool) -> None:
        self.run.finish(exit_code=0 if finished else 1)
        if self.mirror:
            self.mirror.sync(force=True)
