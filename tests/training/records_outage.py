"""A loss log that cannot be written at first, for the rule that a save holds only steps whose records are in
storage."""

from __future__ import annotations

import json

from spotray.accounts import ledger
from spotray.checkpoints.dcp import COMMIT_MARKER
from spotray.errors import StorageError
from spotray.storage import Location


def first_loss_log_write_fails(monkeypatch) -> list[tuple[int, int]]:
    """The loss log's first write fails, and the writer would try it again a minute later. Returns a list that gets,
    for each commit marker written, its step and the last step the loss log in storage held then."""
    monkeypatch.setattr(ledger, "RETRY_FIRST_S", 60.0)
    write_text = Location.write_text
    failures = iter([True])
    logged_through, commits = [0], []

    def flaky(self, text):
        if self.name == "losses.jsonl":
            if next(failures, False):
                raise StorageError("storage is failing")
            logged_through[0] = json.loads(text.splitlines()[-1])["step"]
        if self.name == COMMIT_MARKER:
            commits.append((json.loads(text)["step"], logged_through[0]))
        write_text(self, text)

    monkeypatch.setattr(Location, "write_text", flaky)
    return commits
