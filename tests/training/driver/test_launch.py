"""How ``spotray train``'s driver ends: a user's stop (Ctrl-C, SIGTERM) is recorded as the stop it is, and the rerun
continues the run without counting the pause as an interruption or as the run's time; a survivor's failure keeps no
failed generation alive."""

from __future__ import annotations

import gc
import io
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import weakref
from pathlib import Path

import pytest

from spotray.accounts import endings, goodput, ledger
from spotray.driver import launch
from spotray.driver.launch import _stop_on_sigterm
from spotray.storage import resolve
from spotray.worker.attempt import run_root
from tests.console import assert_quiet_console
from tests.training.configs import make_config
from tests.training.runs import cli_env, train_locally

SPOTRAY = Path(sys.executable).parent / "spotray"


def test_sigterm_of_the_driver_is_a_stop_as_ctrl_c_is():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"), _stop_on_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises at once
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.e2e  # a fit on the session's Ray
def test_after_a_fit_ctrl_c_is_the_drivers_again_not_ray_trains_handler_of_the_ended_controller(dataset_url, tmp_path,
                                                                                               ray_cluster):
    """Ray Train's handler, left behind, called the ended controller: a traceback for a Ctrl-C at the end of a run."""
    before = signal.getsignal(signal.SIGINT)
    launch.run(make_config(dataset_url, str(tmp_path), "ended", "train.max_steps=2", "scaling.num_workers=1"),
               console=io.StringIO())
    assert signal.getsignal(signal.SIGINT) is before


def newest_step(attempts) -> int:
    records = goodput.attempt_records(attempts) if attempts.exists() else []
    return max((r.last_step for r in records), default=0)


@pytest.mark.e2e  # two `spotray train` drivers on the session's Ray
def test_a_ctrl_c_then_a_rerun_is_a_stop_not_an_interruption(dataset_url, tmp_path, ray_address):
    run = ["--set", f"data.path={dataset_url}", "--set", f"checkpoint.path={tmp_path}/ckpt", "--set",
           "train.seq_len=32", "--set", "checkpoint.every_steps=2", "--set", "train.log_every=1", "--set",
           "scaling.num_workers=2", "--set", "run.name=stopped"]
    env = cli_env(RAY_ADDRESS=ray_address)
    attempts = ledger.attempts_root(resolve(str(tmp_path / "ckpt" / "stopped")))
    driver = subprocess.Popen([str(SPOTRAY), "train", *run, "--set", "train.max_steps=100000"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 150
    while newest_step(attempts) < 4 and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    driver.send_signal(signal.SIGINT)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 130 and "spotray: interrupted" in err, err[-3000:]

    stopped_at = newest_step(attempts)
    rerun = subprocess.run([str(SPOTRAY), "train", *run, "--set", f"train.max_steps={stopped_at + 2}"], env=env,
                           capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert_quiet_console(rerun.stdout + rerun.stderr, "the run was stopped by the user at step",
                         "CONTINUING from step")
    status = subprocess.run([str(SPOTRAY), "status", str(tmp_path / "ckpt" / "stopped"), "--json"],
                            capture_output=True, text=True, timeout=60, env=env)
    got = json.loads(status.stdout)
    (stop,) = got["endings"]
    assert (stop["kind"], stop["reason"], stop["spot"]) == ("stopped", "Ctrl-C", False), stop
    assert got["spot_interruptions"] == 0 and got["cost"]["nodes_interrupted"] == 0
    assert got["paused_s"] > 0 and got["state"] == "finished"


def test_a_scripts_summary_gives_the_interval_its_checkpoints_show_not_the_configs():
    from types import SimpleNamespace

    from spotray import config
    from spotray.driver.launch import _cadence

    script = config.load(None, ["script.path=train.py", "checkpoint.every_steps=50", "data.path=/unused"])
    kept = [SimpleNamespace(step=step) for step in (20, 15, 10)]  # newest first, as list_committed gives them
    assert _cadence(script, kept) == 5
    assert _cadence(script, kept[:1]) is None  # one checkpoint shows no interval
    assert _cadence(config.load(None, ["checkpoint.every_steps=50", "data.path=/unused"]), kept) == 50


def test_an_attempt_that_trains_no_step_leaves_the_runs_final_loss_as_it_was(dataset_url, tmp_path):
    """Restarted after its last checkpoint committed (a kill before its final record, survivors that finished while Ray
    Train replaced their lost workers), an attempt resumes at the last step and trains none: the run's final loss is
    its history's at that step."""
    cfg = make_config(dataset_url, str(tmp_path), "done", "train.max_steps=10")
    first = train_locally(cfg)
    again = train_locally(cfg)
    assert len(ledger.read_attempts(resolve(str(tmp_path)).child("done", "attempts"))) == 2
    assert again["final_step"] == 10 and again["final_loss"] == first["final_loss"] is not None


def test_a_scripts_final_loss_is_its_last_logged_one_at_that_step_not_the_final_steps(tmp_path):
    """A Trainer logs its loss every ``logging_steps``: the run ended at step 16, its last loss was logged at 15."""
    from spotray import config
    from tests.training.ledgers import write_attempt

    cfg = config.load(None, ["script.path=train.py", f"checkpoint.path={tmp_path}", "run.name=s", "data.path=/unused"])
    attempts = run_root(cfg).child("attempts")
    write_attempt(attempts, "001", 0, 15, {"entered_at": time.time() - 60})
    ledger.write_final(attempts, "001", {"final_step": 16, "final_loss": 10 / 15, "samples_consumed": None,
                                         "param_sha256": None, "tokens_per_s": None, "attempt_id": "001"})
    summary = launch.summarize(cfg, 0, run_root(cfg))
    assert (summary["final_step"], summary["final_loss_step"], summary["final_loss"]) == (16, 15, 10 / 15)


def test_the_same_command_on_a_finished_run_books_no_workers_and_says_so_in_one_line(dataset_url, tmp_path,
                                                                                    monkeypatch):
    cfg = make_config(dataset_url, str(tmp_path), "done", "train.max_steps=10")
    first = train_locally(cfg)

    def book_workers(*_):
        raise AssertionError("Ray started")

    monkeypatch.setattr(launch, "_ensure_ray", book_workers)
    console = io.StringIO()
    again = launch.run(cfg, console=console)
    checked, preflight = launch.preflight(cfg), launch.preflight

    def checked_again(*_):
        raise AssertionError("preflight ran again")

    monkeypatch.setattr(launch, "preflight", checked_again)  # the caller ran it: not again, whatever it returned
    launch.run(cfg, console=io.StringIO(), task=checked)
    launch.run(cfg, console=io.StringIO(), task=None)  # a script's run has no task
    monkeypatch.setattr(launch, "preflight", preflight)
    assert console.getvalue() == ("spotray: run 'done' finished at step 10 already: nothing to train (raise "
                                  "train.max_steps to train on)\n")
    assert {key: again[key] for key in ("final_step", "final_loss", "param_sha256", "events")} == {
        key: first[key] for key in ("final_step", "final_loss", "param_sha256", "events")}
    stopped = make_config(dataset_url, str(tmp_path), "done", "train.max_steps=20", "train.stop_at_step=10")
    launch.run(stopped, console=console)
    assert console.getvalue().endswith("nothing to train (raise train.stop_at_step to train on)\n")
    # Trained on past its final record, then lost before the next one: there is a step to finish.
    train_locally(make_config(dataset_url, str(tmp_path), "done", "train.max_steps=20"))
    attempts = resolve(str(tmp_path)).child("done", "attempts")
    attempts.child(ledger.read_attempts(attempts)[-1].attempt_id, "final.json").delete_file()
    with pytest.raises(AssertionError, match="Ray started"):
        launch.run(cfg, console=console)


@pytest.mark.parametrize(("ending", "watch_saw_it", "removes"), [
    ((endings.HEAD_LOST, "the controller went with the head"), False, False),  # before the watch's own verdict
    ((endings.HEAD_LOST, "the watch"), True, False),
    ((endings.STOPPED, "Ctrl-C"), False, True),
    ((None, ""), False, True)])
def test_a_driver_that_lost_its_head_never_asks_it_to_remove_the_snapshot_holders(tmp_path, monkeypatch, ending,
                                                                                 watch_saw_it, removes):
    """A call to a lost head waits until Ray ends the driver without a word: the run's one line would never show."""
    removed: list[str] = []
    monkeypatch.setattr(launch, "remove_holders", removed.append)
    root = resolve(str(tmp_path))
    launch._end_driver(root.child("attempts"), root, ending, watch_saw_it)
    assert removed == ([root.url] if removes else [])
    assert json.loads(root.child("attempts", endings.DRIVER_FILE).read_text())["kind"] == ending[0]


def test_a_failure_kept_by_a_survivor_frees_what_its_frames_held_and_keeps_its_lines():
    class Group:  # stands for a failed generation's process group, held by the model's DDP wrapper
        pass

    def step(group: Group) -> None:
        raise RuntimeError("gloo: connection reset by peer")

    group = Group()
    held = weakref.ref(group)
    try:
        try:
            step(group)
        except RuntimeError as inner:
            raise ValueError("the step failed") from inner
    except ValueError as exc:
        kept = launch._without_locals(exc)
    del group
    gc.collect()
    assert held() is None  # nothing of the generation stays alive through the error
    assert kept.__cause__ is not None and "step(group)" in "".join(traceback.format_exception(kept))


@pytest.mark.parametrize(("record", "warning"), [
    (lambda attempts: launch._record_driver_end(attempts, endings.STOPPED, "Ctrl-C"), "how this driver ended"),
    (launch._record_restarted, "how the attempt ended")])
def test_a_driver_that_cannot_record_an_ending_says_so_in_one_warning_and_goes_on(tmp_path, monkeypatch, caplog,
                                                                                 record, warning):
    """Storage may be what failed: the error the user sees stays the run's own."""
    def unreachable(*args):
        raise OSError("S3 unreachable")

    monkeypatch.setattr(launch, "_newest_attempt", lambda attempts: "a")
    monkeypatch.setattr(launch.endings, "record", unreachable)
    record(resolve(str(tmp_path)))
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"could not record {warning}: S3 unreachable"]


def all_gone(names: set[str]) -> set[str]:
    return names


def test_a_finished_run_waits_for_the_evidence_on_a_node_it_lost_in_its_last_seconds_saying_so_once(monkeypatch):
    answers = iter([["ray-2"], ["ray-2"], []])  # the progress monitor's watch recorded the loss at the third look
    monkeypatch.setattr(launch, "awaiting_evidence", lambda attempts, since, gone: next(answers))
    monkeypatch.setattr(launch.time, "sleep", lambda s: None)
    console = io.StringIO()
    launch._await_evidence(resolve("/tmp/unused"), 0.0, console, all_gone)
    assert next(answers, "asked no more") == "asked no more"
    assert console.getvalue() == ("spotray: waiting up to 30s for the evidence on the lost node(s) ray-2, to record "
                                  "why the attempts that held them ended\n")


def test_a_finished_run_waits_for_the_evidence_at_most_its_bound_and_past_a_storage_failure(monkeypatch, caplog):
    monkeypatch.setattr(launch, "EVIDENCE_AT_END_S", 0.2)
    monkeypatch.setattr(launch, "awaiting_evidence", lambda attempts, since, gone: ["ray-2"])
    launch._await_evidence(resolve("/tmp/unused"), 0.0, io.StringIO(), all_gone)  # returns: the bound

    def unreachable(attempts, since, gone):
        raise OSError("S3 unreachable")

    monkeypatch.setattr(launch, "awaiting_evidence", unreachable)
    launch._await_evidence(resolve("/tmp/unused"), 0.0, io.StringIO(), all_gone)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "could not record why the run's last attempts ended: S3 unreachable"]


def test_a_gpu_run_in_float32_is_told_once_at_its_start_what_bfloat16_would_buy():
    """Its steps would run several times slower on the GPUs it pays for; a CPU run, a bfloat16 run and a script (whose
    precision is its own) are told nothing."""
    [note] = [line for line in launch.header(make_config("/d", "/r", "g", "scaling.use_gpu=true"), "log") if
              line.startswith("note:")]
    assert "train.dtype is float32" in note and note.endswith("set train.dtype: bfloat16 unless the model needs "
                                                              "float32")
    for quiet in (["scaling.use_gpu=false"], ["scaling.use_gpu=true", "train.dtype=bfloat16"],
                  ["scaling.use_gpu=true", "script.path=train.py"]):
        assert len(launch.header(make_config("/d", "/r", "g", *quiet), "log")) == 2, quiet
