"""What a person sees of a run: checks of a captured terminal and of the run's log file."""

from __future__ import annotations

import re
from pathlib import Path

from spotray.accounts import endings

# What a default run may print on the terminal, by kind; anything else belongs in the log file.
LINE_KINDS = {
    "header": re.compile(r"^spotray( demo)?: (run |log |\d+ steps of )"),
    "progress": re.compile(r"^(spotray: step \d+/\d+ \||prepare: [\d,]+ docs \|)"),
    "interruption": re.compile(r"^spotray: (PREEMPTION NOTICE|SPOT INTERRUPTION without notice|INTERRUPTED|FAILURE) "
                               r"at step \d+"),
    "pause": re.compile(r"^spotray: the run was (finished|stopped by the user) at step \d+: not an interruption"),
    "recovery": re.compile(r"^spotray: ((MOVING ON|RESUMED|CONTINUING) from step \d+|the workers lost a spot node)"),
    "waiting": re.compile(r"^spotray: WAITING for capacity: "),
    "warning": re.compile(r"^spotray: (warning|error): "),
    "summary": re.compile(r"^(spotray: (done|checkpoints|cost):|cost: |loss curve: |ending |-+ |goodput |"
                          rf"({'|'.join(endings.DESCRIPTIONS)}) )"),
}


def line_kind(line: str) -> str | None:
    return next((kind for kind, pattern in LINE_KINDS.items() if pattern.match(line)), None)


def assert_quiet_console(console: str, *needles: str) -> None:
    """Every line is one of spotray's own kinds, none repeats, no traceback; the header, the summary and each of
    ``needles`` are there."""
    lines = [line for line in console.splitlines() if line.strip()]
    assert "Traceback" not in console and "Failed to query Ray Train Controller" not in console, console
    assert [line for line in lines if line_kind(line) is None] == [], console
    assert len(set(lines)) == len(lines), f"repeated lines:\n{console}"
    assert {"header", "summary"} <= {line_kind(line) for line in lines}, console
    for needle in needles:
        assert needle in console, f"{needle!r} missing:\n{console}"


def the_log(run_dir: Path, console: str) -> str:
    """The one log file of ``run_dir``, which the console's header names; its text."""
    logs = sorted((run_dir / "logs").glob("train-*.log"))
    assert len(logs) == 1, logs
    assert f"log {logs[0]} (--verbose" in console, console
    return logs[0].read_text()


def assert_full_log(log: str, last_step: int) -> None:
    """The log file holds what the terminal leaves out: Ray's lines and the workers' own."""
    assert f"spotray INFO: step {last_step}/{last_step}" in log and "RayTrainWorker" in log, log[-3000:]
    assert "Failed to query Ray Train Controller" not in log, "the state API Ray Train asks for must be there"
