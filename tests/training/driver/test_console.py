"""The run's terminal and its log file: everything the process and its children print lands in the file; the
terminal gets spotray's lines and, once each, the warnings spotray's workers log."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from spotray.driver.console import RunConsole
from spotray.storage import resolve
from tests.console import line_kind

WORKER_WARNING = "(RayTrainWorker pid=41, ip=127.0.0.1) spotray WARNING: checkpoint of step 5 failed (timeout)"


def chatter(console: RunConsole) -> None:
    """What a run's driver process prints: Ray's lines, a child process, workers' lines, its own lines."""
    console.say("run r: 6 steps on 2 workers")
    os.write(1, b"2026-11-24 INFO worker.py:1 -- Started a local Ray instance.\n")
    print("(PlacementGroupCleaner pid=7) some Ray chatter", flush=True)
    subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('a child process writes here\\n')"],
                   check=True)
    print("(RayTrainWorker pid=41) spotray INFO: step 3/6 loss 4.2", flush=True)
    for suffix in ("", " [repeated 3x across cluster]"):  # every rank logs it; Ray folds the repeats
        print(f"\x1b[36m{WORKER_WARNING}\x1b[0m{suffix}", file=sys.stderr, flush=True)
    logging.getLogger("spotray.driver.runtime_env").warning("env.forward: not set on the driver: HF_TOKEN")


def test_the_terminal_gets_spotrays_lines_and_the_log_file_everything(tmp_path, capfd):
    log = resolve(str(tmp_path / "run" / "logs" / "train.log"))
    with RunConsole(log) as console:
        chatter(console)
    out, err = capfd.readouterr()
    assert out == ""
    assert sorted(err.splitlines()) == ["spotray: run r: 6 steps on 2 workers",  # the pump's line may come last
                                        "spotray: warning: checkpoint of step 5 failed (timeout)",
                                        "spotray: warning: env.forward: not set on the driver: HF_TOKEN"]
    assert all(line_kind(line) for line in err.splitlines())
    written = log.read_text()
    for line in ("Started a local Ray instance", "PlacementGroupCleaner", "a child process writes here",
                 "spotray INFO: step 3/6", WORKER_WARNING):
        assert line in written
    assert "spotray: run r" not in written  # the terminal's own lines are not the log's
    assert "\x1b[" not in written, "colour codes are for terminals"


def test_verbose_shows_everything_on_stderr_and_leaves_stdout_to_the_command(tmp_path, capfd):
    log = resolve(str(tmp_path / "train.log"))
    with RunConsole(log, verbose=True) as console:
        chatter(console)
    out, err = capfd.readouterr()
    assert out == ""
    for line in ("Started a local Ray instance", "a child process writes here", "spotray INFO: step 3/6"):
        assert line in err and line in log.read_text()


def test_the_streams_are_restored_when_the_run_fails(tmp_path, capfd):
    log = resolve(str(tmp_path / "train.log"))
    with pytest.raises(RuntimeError), RunConsole(log):
        print("before the failure", flush=True)
        raise RuntimeError("boom")
    print("after", flush=True)
    assert capfd.readouterr().out == "after\n"
    assert "before the failure" in log.read_text()


def test_an_s3_run_uploads_its_log_beside_the_ledger_and_keeps_no_local_copy(s3_bucket, capfd):
    bucket, options = s3_bucket
    log = resolve(f"{bucket}/ckpt/run/logs/train.log", options)
    with RunConsole(log) as console:
        print("(RayTrainWorker pid=41) spotray INFO: step 1/6", flush=True)
        assert console.where.startswith(f"{log.url} (uploaded every 60 s; meanwhile /")
        assert os.path.exists(console.local_path)
    assert "spotray INFO: step 1/6" in log.read_text()
    assert capfd.readouterr().err == ""
    assert not os.path.exists(os.path.dirname(console.local_path))  # every S3 run would leave one in /tmp


def test_an_unreachable_log_bucket_is_one_warning_and_the_log_stays_local(s3_server, capfd):
    from spotray.storage import StorageOptions

    log = resolve("s3://no-such-bucket/run/logs/train.log", StorageOptions(endpoint_url=s3_server))
    with RunConsole(log) as console:
        print("kept", flush=True)
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("spotray: warning: could not upload the log to s3://no-such-bucket")
    assert "kept" in open(console.local_path).read()
