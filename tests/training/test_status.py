"""``spotray status`` on runs built in storage without Ray: the ledger's writers and a one-process Checkpointer.

The run: attempt a trains 1-50 and is drained at step 50; b resumes at 50, trains to 80 and vanishes; c resumes
from the step-70 checkpoint and has trained to 90 of 100, last heard of ``seen_ago`` seconds ago."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from spotray import goodput, ledger, status
from spotray.checkpoint import Checkpointer
from spotray.cli import main
from spotray.storage import resolve
from tests.repo import REPO
from tests.training.ledgers import write_attempt

CHECKPOINT_STEPS = (50, 70)
PARTIAL_STEP_DIR = "step_000000090"  # a save in flight: files written, no commit marker yet


def build_run(run_root, seen_ago: float = 0.0):
    attempts = ledger.attempts_root(run_root)
    t0 = time.time() - 300 - seen_ago
    attempts.child("run.json").write_text(json.dumps({"started_at": t0}))
    write_attempt(attempts, "a", 0, 50, {"step": 50, "entered_at": t0 + 10, "startup_s": 5.0,
                                         "checkpoint_save_s": 2.0, "drain_wait_s": 20.0, "first_step_at": t0 + 16,
                                         "last_seen": t0 + 110,
                                         "notice": {"step": 50, "at": t0 + 90, "committed": True}})
    write_attempt(attempts, "b", 50, 80, {"step": 80, "entered_at": t0 + 130, "startup_s": 4.0, "restore_s": 1.0,
                                          "first_step_at": t0 + 140, "last_seen": t0 + 200})
    write_attempt(attempts, "c", 70, 90, {"step": 90, "entered_at": t0 + 215, "startup_s": 4.0, "restore_s": 1.0,
                                          "checkpoint_save_s": 1.0, "first_step_at": t0 + 225, "last_seen": t0 + 300,
                                          "tokens_per_s": 1234.5})
    checkpointer = Checkpointer(run_root, rank=0, world_size=1, keep_last=10)
    for step in CHECKPOINT_STEPS:
        checkpointer.save(step, {"weights": torch.full((256,), float(step))})
    checkpointer.close()
    run_root.child("checkpoints", PARTIAL_STEP_DIR, "__0_0.distcp").write_bytes(b"\0" * 1024)
    return run_root


@pytest.fixture
def run(tmp_path):
    return build_run(resolve(str(tmp_path / "runs" / "r1")))


def status_json(*args: str, capsys) -> dict:
    assert main(["status", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def stored_bytes(run_dir, step: int) -> int:
    step_dir = run_dir / "checkpoints" / f"step_{step:09d}"
    return sum(f.stat().st_size for f in step_dir.iterdir() if f.name != "COMMITTED.json")


def test_a_training_run_is_live_with_its_progress_checkpoints_and_interruptions(run, tmp_path, capsys):
    got = status_json(run.url, capsys=capsys)
    assert got["state"] == "live" and got["error"] is None
    assert (got["step"], got["max_steps"]) == (90, 100)
    assert got["last_loss"] == pytest.approx(10.0 / 90) and got["tokens_per_s"] == 1234.5
    assert [c["step"] for c in got["checkpoints"]] == [70, 50]  # the partial save at 90 is not one
    for checkpoint in got["checkpoints"]:
        assert checkpoint["bytes"] == stored_bytes(tmp_path / "runs" / "r1", checkpoint["step"]) > 256 * 4
        assert 0 <= checkpoint["age_s"] < 60
    assert [(a["id"], a["from_step"], a["last_step"]) for a in got["attempts"]] == [("a", 0, 50), ("b", 50, 80),
                                                                                  ("c", 70, 90)]
    assert [(e["kind"], e["step"], e["lost_steps"], e["recovery_s"]) for e in got["interruptions"]] == [
        ("notice", 50, 0, 50.0), ("kill", 80, 10, 25.0)]
    assert got["lost_steps"] == 10
    assert got["goodput"] == pytest.approx(90 / 300) and got["total_s"] == pytest.approx(300.0)
    assert got["badput_s"]["wasted"] == 10.0 and set(got["badput_s"]) == set(goodput.CATEGORIES) - {"productive"}


def test_a_run_not_heard_of_for_long_is_stopped_and_one_with_final_metrics_is_finished(tmp_path, capsys):
    run = build_run(resolve(str(tmp_path / "r1")), seen_ago=status.LIVE_WITHIN_S + 60)
    assert status_json(run.url, capsys=capsys)["state"] == "stopped"
    ledger.write_final(ledger.attempts_root(run), "c", {"final_step": 90})
    assert status_json(run.url, capsys=capsys)["state"] == "finished"


def test_the_silence_allowed_to_a_live_run_grows_with_its_step_time(tmp_path, capsys):
    run = build_run(resolve(str(tmp_path / "r1")), seen_ago=600)
    assert status_json(run.url, capsys=capsys)["state"] == "stopped"  # c trained its 20 steps in 75 s
    attempts = ledger.attempts_root(run)
    c = goodput.read_status(attempts, "c")
    attempts.child("c", goodput.STATUS_FILE).write_text(json.dumps({**c, "first_step_at": c["last_seen"] - 1800}))
    assert status_json(run.url, capsys=capsys)["state"] == "live"  # 90 s a step: 600 s is less than a log interval


def test_an_earlier_attempts_final_metrics_do_not_finish_a_run_trained_further(run, capsys):
    attempts = ledger.attempts_root(run)
    ledger.write_final(attempts, "b", {"final_step": 80})
    goodput_status = goodput.read_status(attempts, "c")
    attempts.child("c", goodput.STATUS_FILE).write_text(json.dumps({**goodput_status, "last_seen": 0.0}))
    assert status_json(run.url, capsys=capsys)["state"] == "stopped"


def test_the_text_says_the_same_in_a_few_lines(run, capsys):
    attempts = ledger.attempts_root(run)
    attempts.child("c", goodput.STATUS_FILE).write_text(json.dumps(
        {**goodput.read_status(attempts, "c"), "error": "FloatingPointError: loss is nan at step 90"}))
    kib = [f"{c['bytes'] / 1024:.1f} KiB" for c in status_json(run.url, capsys=capsys)["checkpoints"]]
    assert main(["status", run.url]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^state        stopped \(last seen \d+s ago\): FloatingPointError: loss is nan at step 90$", text,
                     re.M)
    assert "progress     step 90/100, loss 0.1111, 1,234 tok/s" in text
    assert re.search(rf"checkpoints  step 70 \({kib[0]}, \d+s ago\), step 50 \({kib[1]}, \d+s ago\)$", text, re.M)
    assert "notice at step 50: 0 steps lost, resumed from step 50 after 50.0s" in text
    assert "kill at step 80: 10 steps lost (at most 11), resumed from step 70 after 25.0s" in text
    assert "goodput      30.0% of 300s; badput: startup 23s, restore 2s, checkpoint_save 3s, wasted 10s" in text


def snapshot(directory) -> dict:
    return {os.path.join(d, name): os.stat(os.path.join(d, name)).st_mtime_ns
            for d, dirs, files in os.walk(directory) for name in dirs + files}


def test_status_writes_nothing(run, tmp_path, capsys):
    before = snapshot(tmp_path / "runs")
    status_json(f"file://{run.url}", capsys=capsys)
    assert main(["status", run.url]) == 0
    assert snapshot(tmp_path / "runs") == before


def test_a_record_caught_half_written_is_read_again(run, monkeypatch, capsys):
    location = ledger.attempts_root(run).child("c", goodput.STATUS_FILE)
    whole = location.read_text()
    location.write_text(whole[: len(whole) // 2])
    read_status = goodput.read_status

    def read_then_writer_finishes(root, attempt_id):
        try:
            return read_status(root, attempt_id)
        finally:
            location.write_text(whole)

    monkeypatch.setattr(goodput, "read_status", read_then_writer_finishes)
    monkeypatch.setattr(status, "RETRY_PAUSE_S", 0.0)
    assert status_json(run.url, capsys=capsys)["step"] == 90


def test_a_record_that_stays_damaged_ends_in_one_error_line(run, monkeypatch, capsys):
    ledger.attempts_root(run).child("b", "attempt.json").write_text('{"attempt_id": "b", "from_')
    monkeypatch.setattr(status, "RETRY_PAUSE_S", 0.0)
    assert main(["status", run.url]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and run.url in err and "run the command again" in err


@pytest.mark.parametrize("where", ["empty", "missing", "checkpoint_path"])
def test_a_url_that_is_not_a_run_ends_in_one_error_line(run, tmp_path, capsys, where):
    url = {"empty": tmp_path / "empty", "missing": tmp_path / "nothing", "checkpoint_path": tmp_path / "runs"}[where]
    (tmp_path / "empty").mkdir(exist_ok=True)
    assert main(["status", str(url)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"spotray: error: {url} is not a training run") and "<checkpoint.path>/<run.name>" in err


def test_the_command_line_exits_2_with_one_line_and_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spotray.cli", "status", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"spotray: error: {tmp_path} is not a training run (it has no attempts/ or "
                                        f"checkpoints/): {status.RUN_URL_HINT}"]


def test_a_run_on_s3(s3_bucket, s3_server, capsys):
    import boto3

    bucket_url, options = s3_bucket
    run = build_run(resolve(f"{bucket_url}/runs/r1", options))
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    bucket = bucket_url.removeprefix("s3://")

    def objects() -> dict:
        return {o["Key"]: (o["ETag"], o["LastModified"]) for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}

    before = objects()
    got = status_json(run.url, "--endpoint-url", s3_server, capsys=capsys)
    assert objects() == before
    assert got["run"] == f"{bucket_url}/runs/r1" and (got["state"], got["step"]) == ("live", 90)
    sizes = {k: s3.head_object(Bucket=bucket, Key=k)["ContentLength"] for k in before}
    assert [(c["step"], c["bytes"]) for c in got["checkpoints"]] == [
        (step, sum(size for key, size in sizes.items() if f"step_{step:09d}/" in key
                   and not key.endswith("COMMITTED.json"))) for step in (70, 50)]
    assert [e["kind"] for e in got["interruptions"]] == ["notice", "kill"]
    assert main(["status", f"{bucket_url}/runs", "--endpoint-url", s3_server]) == 2
    assert "is not a training run" in capsys.readouterr().err
