"""``spotray status`` on runs built in storage without Ray: the ledger's writers and a one-process Checkpointer.

The run: attempt a trains 1-50 and is drained at step 50; b resumes at 50, trains to 80 and vanishes; c resumes
from the step-70 checkpoint and has trained to 90 of 100, last heard of ``seen_ago`` seconds ago. An ``evaluated``
run also has evaluations (``EVALS``), checkpoints with their val loss and log intervals with every rank's memory."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from spotray.accounts import endings, goodput, ledger
from spotray.checkpoints.dcp import Checkpointer
from spotray.cli import main
from spotray.ray_local import free_port
from spotray.reports import status
from spotray.storage import resolve
from tests.repo import REPO
from tests.training.ledgers import write_attempt

CHECKPOINT_STEPS = (50, 70)
PARTIAL_STEP_DIR = "step_000000090"  # a save in flight: files written, no commit marker yet
GiB = 1 << 30
# attempt -> step -> val loss. b's 80 is lost (c resumed from 70), so its low val loss is not the final model's.
EVALS = {"a": {25: 4.0, 50: 3.5}, "b": {60: 3.3, 70: 3.4, 80: 2.0}, "c": {80: 3.2, 90: 3.25}}
LINEAGE_EVALS = {25: 4.0, 50: 3.5, 60: 3.3, 70: 3.4, 80: 3.2, 90: 3.25}
# attempt -> step -> (rss, peak rss) per rank, CPU workers (no CUDA). c's last interval is the one reported.
INTERVALS: dict[str, dict[int, tuple[list[float], list[float]]]] = {"b": {80: ([9 * GiB, 9 * GiB], [9 * GiB, 9 * GiB])},
             "c": {80: ([2 * GiB, GiB], [2 * GiB, 2 * GiB]), 90: ([1.2 * GiB, 1.3 * GiB], [1.6 * GiB, 1.5 * GiB])}}


def build_run(run_root, seen_ago: float = 0.0, evaluated: bool = False):
    attempts = ledger.attempts_root(run_root)
    t0 = time.time() - 300 - seen_ago
    attempts.child("run.json").write_text(json.dumps({"started_at": t0}))
    write_attempt(attempts, "a", 0, 50, {"step": 50, "entered_at": t0 + 10, "startup_s": 5.0,
                                         "checkpoint_save_s": 2.0, "drain_wait_s": 20.0, "first_step_at": t0 + 16,
                                         "last_seen": t0 + 110,
                                         "notice": {"step": 50, "at": t0 + 90, "committed": True}})
    write_attempt(attempts, "b", 50, 80, {"step": 80, "entered_at": t0 + 130, "startup_s": 4.0, "restore_s": 1.0,
                                          "first_step_at": t0 + 140, "last_seen": t0 + 200})
    endings.record(attempts, "b", endings.KILL, "node n2 (spot) lost: Ray says UNEXPECTED_TERMINATION")
    attempts.child(endings.DRIVER_FILE).write_text(json.dumps({"ended": False}))  # the driver of c runs
    write_attempt(attempts, "c", 70, 90, {"step": 90, "entered_at": t0 + 215, "startup_s": 4.0, "restore_s": 1.0,
                                          "checkpoint_save_s": 1.0, "first_step_at": t0 + 225, "last_seen": t0 + 300,
                                          "tokens_per_s": 1234.5, **({"eval_s": 3.0} if evaluated else {})})
    checkpointer = Checkpointer(run_root, rank=0, world_size=1, keep_last=10)
    for step in CHECKPOINT_STEPS:
        checkpointer.save(step, {"weights": torch.full((256,), float(step))},
                          val_loss=LINEAGE_EVALS[step] if evaluated else None)
    checkpointer.close()
    run_root.child("checkpoints", PARTIAL_STEP_DIR, "__0_0.distcp").write_bytes(b"\0" * 1024)
    if evaluated:
        write_evals_and_intervals(attempts)
    return run_root


def write_evals_and_intervals(attempts, cuda: bool = False) -> None:
    """``EVALS`` and ``INTERVALS`` as rank 0 records them; ``cuda``: the workers are GPU ones."""
    writer = ledger.RecordWriter()
    for attempt_id, evals in EVALS.items():
        log = ledger.eval_log(attempts, attempt_id, writer)
        for step, val_loss in evals.items():
            log.record(step, metrics={"val_loss": val_loss, "val_perplexity": math.exp(val_loss),
                                      "accuracy": step / 100}, s=0.1)
    for attempt_id, intervals in INTERVALS.items():
        log = ledger.interval_log(attempts, attempt_id, writer)
        for step, (rss, peak_rss) in intervals.items():
            log.record(step, tokens_per_s=1000.0, mfu=None, goodput=0.5, step_s=1.0, memory={
                "rss_bytes": [int(b) for b in rss], "peak_rss_bytes": [int(b) for b in peak_rss],
                "cuda_allocated_peak_bytes": [3 * GiB, 2 * GiB] if cuda else None,
                "cuda_reserved_peak_bytes": [4 * GiB, 5 * GiB] if cuda else None})
    assert writer.flush(timeout_s=10)


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
    assert [(e["kind"], e["step"], e["lost_steps"], e["recovery_s"]) for e in got["endings"]] == [
        ("notice", 50, 0, 50.0), ("kill", 80, 10, 25.0)]
    assert got["spot_interruptions"] == 2 and not got["endings_unrecorded"]
    assert [a["ending"] for a in got["attempts"]] == ["notice", "kill", "unknown"]  # c trains still
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
    assert c is not None
    attempts.child("c", goodput.STATUS_FILE).write_text(json.dumps({**c, "first_step_at": c["last_seen"] - 1800}))
    assert status_json(run.url, capsys=capsys)["state"] == "live"  # 90 s a step: 600 s is less than a log interval


def test_an_earlier_attempts_final_metrics_do_not_finish_a_run_trained_further(run, capsys):
    attempts = ledger.attempts_root(run)
    ledger.write_final(attempts, "b", {"final_step": 80})
    goodput_status = goodput.read_status(attempts, "c")
    assert goodput_status is not None
    attempts.child("c", goodput.STATUS_FILE).write_text(json.dumps({**goodput_status, "last_seen": 0.0}))
    assert status_json(run.url, capsys=capsys)["state"] == "stopped"


def test_a_ledger_from_before_endings_reads_unknown_and_says_so_once(run, capsys):
    attempts = ledger.attempts_root(run)
    attempts.child(endings.DRIVER_FILE).delete_file()  # as a ledger written before drivers recorded themselves
    attempts.child("b", endings.ENDING_FILE).delete_file()
    got = status_json(run.url, capsys=capsys)
    assert [e["kind"] for e in got["endings"]] == ["notice", "unknown"] and got["endings_unrecorded"]
    assert got["spot_interruptions"] == 1 and got["cost"]["nodes_interrupted"] == 1  # unknown is never one
    assert main(["status", run.url]) == 0
    text = capsys.readouterr().out
    assert text.count("predates recorded endings") == 1, text


def with_snapshot(run) -> dict:
    """Attempt c's rank 0 records a snapshot of step 88 on two nodes."""
    attempts = ledger.attempts_root(run)
    c = goodput.read_status(attempts, "c")
    assert c is not None
    snapshot = {"step": 88, "nodes": {"n1": {"bytes": 3 << 20, "cap": 5 << 30}, "n2": {"bytes": 1 << 20,
                                                                                    "cap": 4 << 30}}}
    attempts.child("c", goodput.STATUS_FILE).write_text(json.dumps({**c, "snapshot": snapshot}))
    return snapshot


def test_the_newest_attempts_snapshot_is_shown_with_what_its_nodes_hold(run, capsys):
    assert main(["status", run.url]) == 0
    assert "snapshots" not in capsys.readouterr().out  # a run that took none
    snapshot = with_snapshot(run)
    assert status_json(run.url, capsys=capsys)["snapshot"] == {**snapshot, "held": True}  # c's driver runs
    assert main(["status", run.url]) == 0
    assert ("snapshots    step 88 in memory on 2 nodes, up to 3.0 MiB on one (each may hold 4.0 GiB)"
            in capsys.readouterr().out)


def test_a_snapshot_is_not_shown_as_held_once_the_driver_that_let_its_holders_go_has_ended(run, capsys):
    with_snapshot(run)
    endings.driver_ended(ledger.attempts_root(run), "c", None, "")
    assert status_json(run.url, capsys=capsys)["snapshot"]["held"] is False
    assert main(["status", run.url]) == 0
    assert ("snapshots    step 88, released when the run's driver ended (up to 3.0 MiB held on one of 2 nodes)"
            in capsys.readouterr().out)


def test_the_newest_attempts_size_is_shown_against_the_configured_one(run, capsys):
    assert status_json(run.url, capsys=capsys)["workers"] == {"now": 2, "configured": 2}  # not recorded: its own
    attempts = ledger.attempts_root(run)
    ledger.write_attempt(attempts, ledger.AttemptInfo("c", 70, 3, 4, started_at=1.0, configured_workers=4))
    assert status_json(run.url, capsys=capsys)["workers"] == {"now": 3, "configured": 4}
    assert main(["status", run.url]) == 0
    assert ("workers      3 of 4 (shrunk after a lost node: it grows back when capacity returns)"
            in capsys.readouterr().out)


def test_the_text_says_the_same_in_a_few_lines(run, capsys):
    attempts = ledger.attempts_root(run)
    goodput_status = goodput.read_status(attempts, "c")
    assert goodput_status is not None
    attempts.child("c", goodput.STATUS_FILE).write_text(json.dumps(
        {**goodput_status, "error": "FloatingPointError: loss is nan at step 90", "from_snapshot": True}))
    kib = [f"{c['bytes'] / 1024:.1f} KiB" for c in status_json(run.url, capsys=capsys)["checkpoints"]]
    assert main(["status", run.url]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^state        stopped \(last seen \d+s ago\): FloatingPointError: loss is nan at step 90$", text,
                     re.M)
    assert "progress     step 90/100, loss 0.1111, 1,234 tok/s" in text
    assert re.search(rf"checkpoints  step 70 \({kib[0]}, \d+s ago\), step 50 \({kib[1]}, \d+s ago\)$", text, re.M)
    assert ("notice at step 50 (spot interruption, notice at step 50): 0 steps lost, resumed from step 50 after 50.0s"
            in text)
    assert ("kill at step 80 (spot interruption, node n2 (spot) lost: Ray says UNEXPECTED_TERMINATION): 10 steps "
            "lost (at most 11), resumed from step 70 (a snapshot in memory) after 25.0s" in text)
    assert "attempts     3, 2 spot interruptions, 10 steps lost" in text
    assert ("goodput      30.0% of 300s; badput: startup 23s, restore 2s, checkpoint_save 3s, eval 0s, wasted 10s"
            in text)
    assert "val loss     none evaluated (evaluation is off, or none has run yet)" in text
    assert "memory       not recorded yet (no log interval of the newest attempt)" in text


@pytest.fixture
def evaluated_run(tmp_path):
    return build_run(resolve(str(tmp_path / "runs" / "r1")), evaluated=True)


def test_the_final_models_evaluations_its_best_checkpoint_and_its_lowest_val_loss(evaluated_run, capsys):
    got = status_json(evaluated_run.url, capsys=capsys)
    assert [e["step"] for e in got["evals"]] == list(LINEAGE_EVALS)  # b's 80 was lost: c trained 71-90 again
    assert [e["step"] for e in got["evals"]] == list(ledger.lineage_evals(ledger.attempts_root(evaluated_run)))
    assert [e["metrics"]["val_loss"] for e in got["evals"]] == list(LINEAGE_EVALS.values())
    assert got["evals"][-1]["metrics"] == {"val_loss": 3.25, "val_perplexity": pytest.approx(math.exp(3.25)),
                                           "accuracy": 0.9}
    assert got["val_loss"] == 3.25
    assert [(c["step"], c["val_loss"]) for c in got["checkpoints"]] == [(70, 3.4), (50, 3.5)]
    assert got["best"] == {"step": 70, "val_loss": 3.4, "url": got["checkpoints"][0]["url"]}
    assert got["best_eval"] == {"step": 80, "val_loss": 3.2}  # evaluated, but no checkpoint of step 80 committed
    assert got["badput_s"]["eval"] == 3.0


def test_memory_is_each_kinds_largest_rank_at_the_newest_attempts_last_interval(evaluated_run, capsys):
    got = status_json(evaluated_run.url, capsys=capsys)["memory"]
    assert got == {"rss_bytes": {"max": int(1.3 * GiB), "rank": 1},
                   "peak_rss_bytes": {"max": int(1.6 * GiB), "rank": 0},
                   "cuda_allocated_peak_bytes": None, "cuda_reserved_peak_bytes": None}
    write_evals_and_intervals(ledger.attempts_root(evaluated_run), cuda=True)
    got = status_json(evaluated_run.url, capsys=capsys)["memory"]
    assert got["cuda_allocated_peak_bytes"] == {"max": 3 * GiB, "rank": 0}
    assert got["cuda_reserved_peak_bytes"] == {"max": 5 * GiB, "rank": 1}


def test_a_rerun_of_a_finished_run_that_trained_nothing_keeps_the_memory_of_the_attempt_before(evaluated_run, capsys):
    attempts = ledger.attempts_root(evaluated_run)
    ledger.write_final(attempts, "c", {"final_step": 90})
    measured = status_json(evaluated_run.url, capsys=capsys)["memory"]
    write_attempt(attempts, "d", 90, 90, {"step": 90, "entered_at": time.time() - 5, "startup_s": 4.0})
    assert status_json(evaluated_run.url, capsys=capsys)["memory"] is None  # d may still train: not measured yet
    ledger.write_final(attempts, "d", {"final_step": 90})
    assert status_json(evaluated_run.url, capsys=capsys)["memory"] == measured is not None


def test_the_text_has_the_last_evaluations_the_best_and_the_memory(evaluated_run, capsys):
    write_evals_and_intervals(ledger.attempts_root(evaluated_run), cuda=True)
    assert main(["status", evaluated_run.url]) == 0
    text = capsys.readouterr().out
    assert ("val loss     step 50 3.5000, step 60 3.3000, step 70 3.4000, step 80 3.2000, step 90 3.2500 (the last 5 "
            "of 6); best step 70 3.4000 (checkpoint kept); lowest evaluated step 80 3.2000 (no checkpoint kept)\n"
            ) in text
    assert "checkpoint_save 3s, eval 3s, wasted 10s" in text
    assert ("memory       host RSS 1.3 GiB (rank 1), peak 1.6 GiB (rank 0); CUDA allocated peak 3.0 GiB (rank 0), "
            "reserved peak 5.0 GiB (rank 1)\n") in text


def test_without_checkpoints_of_evaluated_steps_the_best_is_the_lowest_evaluation(tmp_path, capsys):
    run = build_run(resolve(str(tmp_path / "r1")))  # checkpoints without a val loss (e.g. emergency ones)
    write_evals_and_intervals(ledger.attempts_root(run))
    got = status_json(run.url, capsys=capsys)
    assert got["best"] is None and all(c["val_loss"] is None for c in got["checkpoints"])
    assert got["best_eval"] == {"step": 80, "val_loss": 3.2}
    assert main(["status", run.url]) == 0
    assert "(the last 5 of 6); best step 80 3.2000 (no checkpoint kept)\n" in capsys.readouterr().out


def test_a_newly_started_attempt_has_no_memory_yet_and_keeps_the_lineages_evaluations(evaluated_run, capsys):
    attempts = ledger.attempts_root(evaluated_run)
    t0 = time.time()
    write_attempt(attempts, "d", 90, 90, {"step": 90, "entered_at": t0 - 5, "last_seen": t0})
    got = status_json(evaluated_run.url, capsys=capsys)
    assert got["memory"] is None
    assert [e["step"] for e in got["evals"]] == list(LINEAGE_EVALS) and got["val_loss"] == 3.25


def test_a_run_with_no_attempt_yet_has_the_same_keys(run, tmp_path, capsys):
    empty = tmp_path / "runs" / "r0"
    (empty / "attempts").mkdir(parents=True)
    got = status_json(str(empty), capsys=capsys)
    assert set(got) == set(status_json(run.url, capsys=capsys))
    assert (got["evals"], got["val_loss"], got["best"], got["best_eval"], got["memory"]) == ([], None, None, None,
                                                                                           None)
    assert main(["status", str(empty)]) == 0
    text = capsys.readouterr().out
    assert "val loss     none evaluated" in text and "memory       not recorded yet" in text


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


def test_a_scripts_loss_logged_every_few_steps_is_shown_with_the_step_it_was_logged_at(tmp_path, capsys):
    """A Trainer logs its loss every logging_steps: the newest step mostly has none, and status showed no loss."""
    root = resolve(str(tmp_path / "runs" / "script"))
    attempts = ledger.attempts_root(root)
    write_attempt(attempts, "a", 0, 0, {"entered_at": time.time() - 60, "first_step_at": time.time() - 50,
                                        "last_seen": time.time(), "step": 8})
    writer = ledger.RecordWriter()
    losses = ledger.LossLog(attempts, "a", writer)
    for step in range(1, 9):
        losses.record(step, loss=4.5 if step == 5 else None, seconds=1.0)
    losses.flush()
    writer.close(timeout_s=10)
    got = status_json(root.url, capsys=capsys)
    assert (got["step"], got["last_loss"], got["last_loss_step"]) == (8, 4.5, 5)
    assert main(["status", root.url]) == 0
    assert "step 8/100, loss 4.5000 (logged at step 5)" in capsys.readouterr().out


def test_a_url_in_a_bucket_that_does_not_exist_names_the_bucket(capsys, s3_server):
    assert main(["status", "s3://missing/runs/r1", "--endpoint-url", s3_server]) == 2
    assert capsys.readouterr().err.strip() == ("spotray: error: s3://missing/runs/r1 is not a training run: bucket "
                                               "'missing' does not exist; check the bucket name and --endpoint-url")


def test_a_store_that_does_not_answer_is_told_to_check_the_endpoint_not_the_runs_url(capsys):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["status", "s3://b/runs/r1", "--endpoint-url", endpoint]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"spotray: error: cannot stat s3://b/runs/r1/attempts: the object store at {endpoint} does "
                          "not answer (") and len(err.splitlines()) == 1, err
    assert err.endswith(": correct --endpoint-url, or start the store"), err


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
    assert [e["kind"] for e in got["endings"]] == ["notice", "kill"]
    assert main(["status", f"{bucket_url}/runs", "--endpoint-url", s3_server]) == 2
    assert "is not a training run" in capsys.readouterr().err
