"""The driver's experiment trackers fed from hand-made ledgers: a real MLflow server, TensorBoard event files and W&B
offline records, each read back with the tracker's own reader (tests/trackers.py)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from spotray import config
from spotray.accounts import ledger
from spotray.driver import launch
from spotray.errors import ConfigError, TrainingFailed
from spotray.tracking import Follower, read_gaps
from spotray.tracking import state as tracking_state
from spotray.worker.attempt import run_root
from tests.corpus import write_corpus
from tests.repo import readme_example
from tests.trackers import (
    assert_one_point_per_step,
    mlflow_points,
    mlflow_runs,
    mlflow_server_fixture,  # noqa: F401 - the module's server, `mlflow_server`
    series,
    tensorboard_points,
    tensorboard_texts,
    wandb_config,
    wandb_file_points,
    wandb_files,
    wandb_points,
    wandb_summary,
)
from tests.training.runs import cli_env
from tests.training.tracked_ledgers import KILLED, LOG_EVERY, expected_series, loss, write_attempt

SPOTRAY = Path(sys.executable).parent / "spotray"
NEVER = 3600.0  # the follower's own thread stays asleep: the tests poll


def tracked_config(tmp_path: Path, mlflow_url: str, name: str = "tracked", *overrides: str) -> config.TrainConfig:
    """All three trackers; the MLflow experiment is the test's own."""
    return config.load(None, [
        "data.path=/unused", f"checkpoint.path={tmp_path / 'runs'}", f"run.name={name}", "train.max_steps=40",
        f"train.log_every={LOG_EVERY}",
        f"tracking.mlflow.uri={mlflow_url}", f"tracking.mlflow.experiment={tmp_path.name}",
        "tracking.wandb.project=spotray-tests", "tracking.wandb.mode=offline",
        f"tracking.tensorboard.dir={tmp_path / 'tb'}", *overrides])


def summary(final_step: int) -> dict:
    return {"run_name": "tracked", "final_step": final_step, "final_loss": loss(final_step), "goodput": 0.9,
            "events": [], "tracking_gaps": []}


class Run:
    """A run's trackers, as the tests read them."""

    def __init__(self, cfg: config.TrainConfig, mlflow_url: str):
        self.cfg, self.mlflow_url, self.root = cfg, mlflow_url, run_root(cfg)
        self.attempts = ledger.attempts_root(self.root)
        assert cfg.tracking.tensorboard is not None
        self.tensorboard_dir = Path(cfg.tracking.tensorboard.dir) / cfg.run.name
        self.wandb_dir = Path(self.root.path) / "wandb"

    def follower(self, console: io.StringIO | None = None, **bounds) -> Follower:
        return Follower(self.cfg, self.root, stream=console or io.StringIO(), poll_s=NEVER, **bounds)

    def run_id(self, tracker: str) -> str:
        run_id = tracking_state.load(self.root).cursors[tracker].run_id
        assert run_id is not None
        return run_id

    def mlflow_run(self):
        assert self.cfg.tracking.mlflow is not None
        (run,) = [r for r in mlflow_runs(self.mlflow_url, self.cfg.tracking.mlflow.experiment)
                  if r.data.tags["spotray.run"] == self.root.url]
        return run

    def points(self, name: str) -> dict[str, list[tuple[int, float]]]:
        return {"mlflow": mlflow_points(self.mlflow_url, self.mlflow_run().info.run_id, name),
                "tensorboard": tensorboard_points(self.tensorboard_dir, name),
                "wandb": wandb_points(self.wandb_dir, self.run_id("wandb"), name)}

    def assert_trackers_hold_the_lineage(self) -> None:
        """Each tracker: one point per step, in order, equal to the ledger's lineage, for every series."""
        for name, wanted in expected_series(self.attempts).items():
            for tracker, points in self.points(name).items():
                assert_one_point_per_step(points)
                assert series(points) == pytest.approx(wanted, rel=1e-6), (tracker, name)


@pytest.mark.e2e
def test_two_attempts_make_one_tracker_run_each_with_one_point_per_step_of_the_lineage(tmp_path, mlflow_server):
    run = Run(tracked_config(tmp_path, mlflow_server.url), mlflow_server.url)
    console = io.StringIO()
    with run.follower(console) as follower:
        write_attempt(run.attempts, "a", 0, 30, started_at=1000.0, killed=True)
        follower.poll()
        assert [s for s, _ in run.points("train/loss")["mlflow"]] == list(range(1, 26))  # one log interval behind
        write_attempt(run.attempts, "b", 20, 40, started_at=1100.0)  # resumed below the steps logged already
    follower.finish(summary(40))

    assert list(ledger.lineage(run.attempts)) == list(range(1, 41))
    run.assert_trackers_hold_the_lineage()
    mlflow_run = run.mlflow_run()
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params["train.log_every"] == str(LOG_EVERY)
    assert mlflow_run.data.params["tracking.wandb.mode"] == "offline"
    kill = {"kind": "kill", "reason": KILLED, "spot": True, "step": 30, "lost_steps": 10, "lost_steps_at_most": 19,
            "recovery_s": 70.0, "resumed_from": 20, "from_snapshot": False}
    assert json.loads(mlflow_run.data.tags["spotray.ending.1"]) == kill
    assert mlflow_run.data.metrics["summary/final_loss"] == loss(40)
    assert wandb_summary(run.wandb_dir, run.run_id("wandb"))["endings"] == [kill]
    assert wandb_summary(run.wandb_dir, run.run_id("wandb"))["spot_interruptions"] == 1
    assert wandb_config(run.wandb_dir, run.run_id("wandb"))["train.log_every"] == str(LOG_EVERY)
    assert tensorboard_texts(run.tensorboard_dir, "endings") == [
        (20, f"kill at step 30 ({KILLED}): 10 steps lost, resumed from step 20 after 70.0 s")]
    assert "| final_loss | 0.25 |" in tensorboard_texts(run.tensorboard_dir, "summary")[0][1]
    assert read_gaps(run.root) == [] and console.getvalue() == ""


def test_a_rerun_after_the_driver_failed_continues_the_same_tracker_runs_with_the_new_steps_only(tmp_path,
                                                                                                 mlflow_server):
    run = Run(tracked_config(tmp_path, mlflow_server.url), mlflow_server.url)
    write_attempt(run.attempts, "a", 0, 20, started_at=1000.0)
    with pytest.raises(TrainingFailed), run.follower():
        raise TrainingFailed("training run 'tracked' lost its Ray cluster")
    first = run.mlflow_run()
    assert first.info.status == "KILLED"  # not finished: a rerun continues it
    # The state lags what MLflow and TensorBoard hold, as after a driver lost between a send and its state write.
    state = tracking_state.load(run.root)
    state.cursors["mlflow"].logged_step = state.cursors["tensorboard"].logged_step = 15
    tracking_state.state_location(run.root).write_text(state.to_json())

    write_attempt(run.attempts, "b", 20, 40, started_at=1100.0)
    with run.follower() as rerun:
        pass
    rerun.finish(summary(40))

    assert run.mlflow_run().info.run_id == first.info.run_id and run.mlflow_run().info.status == "FINISHED"
    run.assert_trackers_hold_the_lineage()
    files = wandb_files(run.wandb_dir, run.run_id("wandb"))
    assert [[step for step, _ in wandb_file_points(f, "train/loss")] for f in files] == [list(range(1, 21)),
                                                                                          list(range(21, 41))]
    assert len(list(run.tensorboard_dir.glob("events.out.tfevents.*"))) == 2


@pytest.mark.e2e
def test_the_readme_example_evaluates_keeps_the_best_and_logs_one_run_to_every_tracker(tmp_path, mlflow_server,
                                                                                       ray_address):
    """As shown, with this module's MLflow server in place of the example's address, on the session's Ray."""
    commands = readme_example("tracking-example").replace("http://127.0.0.1:5000", mlflow_server.url)
    write_corpus(tmp_path / "corpus")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=tmp_path,
                          env=cli_env(RAY_ADDRESS=ray_address), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert sorted(int(step) for step in summary["evals"]) == [20, 40, 60] and summary["tracking_gaps"] == []
    assert f"exported step {summary['best']['step']} to best-model in float32" in proc.stdout
    assert "val loss     step 20 " in proc.stdout and "(checkpoint kept)" in proc.stdout  # spotray status
    [run] = mlflow_runs(mlflow_server.url, "readme")
    losses = mlflow_points(mlflow_server.url, run.info.run_id, "train/loss")
    assert run.info.status == "FINISHED" and series(losses) == {int(k): v for k, v in summary["losses"].items()}
    assert [step for step, _ in mlflow_points(mlflow_server.url, run.info.run_id, "val/loss")] == [20, 40, 60]
    assert tensorboard_points(tmp_path / "tensorboard" / "tracked", "val/loss")[-1][0] == 60
    assert list((tmp_path / "spotray-runs" / "tracked" / "wandb").glob("offline-run-*"))


@pytest.mark.parametrize("tracker", ["mlflow", "wandb", "tensorboard"])
def test_a_tracker_whose_library_is_missing_stops_the_run_in_preflight(tmp_path, monkeypatch, tracker):
    section = {"mlflow": "tracking.mlflow.uri=http://127.0.0.1:1", "wandb": "tracking.wandb.project=p",
               "tensorboard": f"tracking.tensorboard.dir={tmp_path}"}[tracker]
    monkeypatch.setitem(sys.modules, tracker, None)  # as if it were not installed
    with pytest.raises(ConfigError) as error:
        launch.preflight(config.load(None, ["data.path=/unused", section]))
    assert str(error.value) == (f"config 'tracking.{tracker}': the {tracker} library is not installed. "
                                f"pip install 'spotray[{tracker}]'")


def test_an_mlflow_outage_is_caught_up_within_the_retry_bound_and_a_gap_beyond_it(tmp_path, mlflow_server):
    within = Run(tracked_config(tmp_path, mlflow_server.url, "within"), mlflow_server.url)
    beyond = Run(tracked_config(tmp_path, mlflow_server.url, "beyond"), mlflow_server.url)
    consoles = io.StringIO(), io.StringIO()
    with within.follower(consoles[0]) as patient, beyond.follower(consoles[1], max_pending_points=5) as impatient:
        for run in (within, beyond):
            write_attempt(run.attempts, "a", 0, 15, started_at=1000.0)
        assert patient.poll() and impatient.poll()  # steps 1-10
        mlflow_server.stop()
        try:
            for run in (within, beyond):
                write_attempt(run.attempts, "a", 0, 40, started_at=1000.0)
            assert not patient.poll() and not impatient.poll()  # a warning each
            assert not patient.poll() and impatient.poll()  # past its bound, `beyond` dropped steps 11-35
        finally:
            mlflow_server.start()  # the same port and database
        assert patient.poll() and impatient.poll()
    for follower in (patient, impatient):
        follower.finish(summary(40))

    wanted = expected_series(within.attempts)["train/loss"]
    assert_one_point_per_step(mlflow_points(mlflow_server.url, within.mlflow_run().info.run_id, "train/loss"))
    assert series(mlflow_points(mlflow_server.url, within.mlflow_run().info.run_id, "train/loss")) == wanted
    assert read_gaps(within.root) == []
    # Steps 11-35: 3 step metrics each, 6 at each log interval (15, 20, 25, 30, 35), 3 at each evaluation (20, 30).
    assert read_gaps(beyond.root) == [{"tracker": "mlflow", "first_step": 11, "last_step": 35, "points": 111}]
    kept = [s for s, _ in mlflow_points(mlflow_server.url, beyond.mlflow_run().info.run_id, "train/loss")]
    assert kept == [*range(1, 11), *range(36, 41)]
    for console in consoles:
        (warning,) = console.getvalue().splitlines()
        assert warning.startswith(f"spotray: warning: tracking.mlflow: cannot send to {mlflow_server.url} (")


def test_a_run_on_s3_gets_its_tensorboard_files_beside_it(tmp_path, s3_bucket):
    bucket_url, options = s3_bucket
    cfg = config.load(None, ["data.path=/unused", f"checkpoint.path={bucket_url}/runs", "run.name=on-s3",
                             f"storage.endpoint_url={options.endpoint_url}", f"train.log_every={LOG_EVERY}",
                             f"tracking.tensorboard.dir={tmp_path / 'tb'}"])
    write_attempt(ledger.attempts_root(run_root(cfg)), "a", 0, 20, started_at=1000.0)
    with Follower(cfg, run_root(cfg), poll_s=NEVER) as follower:
        pass
    follower.finish(summary(20))
    local = sorted((tmp_path / "tb" / "on-s3").iterdir())
    uploaded = run_root(cfg).child("tensorboard")
    assert uploaded.list_names() == [path.name for path in local]
    assert all(uploaded.child(path.name).read_bytes() == path.read_bytes() for path in local)


def test_an_unknown_tracking_key_is_one_line_naming_it(tmp_path):
    (tmp_path / "run.yaml").write_text("data: {path: /unused}\ntracking:\n  mlflow: {uri: http://127.0.0.1:1}\n")
    proc = subprocess.run([str(SPOTRAY), "train", "--config", str(tmp_path / "run.yaml"), "--set",
                           "tracking.mlflow.bogus=1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("spotray: error:")]
    assert "config 'tracking.mlflow.bogus': unknown key" in error


def test_a_tracker_whose_call_never_returns_holds_up_neither_training_nor_the_end_of_the_run(tmp_path, monkeypatch):
    """The trackers' no-effect check: they follow the ledger from their own thread, so a hung one (a server that
    accepts the connection and never answers) costs the run nothing but a warning. Mutation run (2026-11-30): with
    ``Follower.__exit__`` joining its thread without a bound, this test fails on its deadline."""
    from spotray.tracking.tensorboard_sink import TensorboardSink

    cfg = config.load(None, ["data.path=/unused", f"checkpoint.path={tmp_path / 'runs'}", "run.name=hung",
                             "train.max_steps=40", f"train.log_every={LOG_EVERY}",
                             f"tracking.tensorboard.dir={tmp_path / 'tb'}"])
    called, release = threading.Event(), threading.Event()

    def hang(self, rows):
        called.set()
        release.wait()

    monkeypatch.setattr(TensorboardSink, "rows", hang)
    root = run_root(cfg)
    console = io.StringIO()
    follower = Follower(cfg, root, stream=console, poll_s=0.05, retry_for_s=0.5)
    trained = threading.Event()

    def run() -> None:
        with follower:
            write_attempt(ledger.attempts_root(root), "a", 0, 40, started_at=1000.0)  # training goes on
            assert called.wait(30)
            trained.set()
        follower.finish(summary(40))

    driver = threading.Thread(target=run, daemon=True)
    driver.start()
    driver.join(timeout=60)
    try:
        assert trained.is_set() and not driver.is_alive(), "the run waited for a tracker that never answers"
        assert follower.stuck == "tensorboard"
        assert "tracking.tensorboard: a call to the tracker has not returned in 0.55 s" in console.getvalue()
    finally:
        release.set()


@pytest.mark.parametrize(("down_before_the_end_s", "waited_s"), [(400.0, 0.0), (100.0, 200.0)])
def test_the_end_of_a_run_waits_for_a_tracker_only_until_its_outage_reaches_the_retry_bound(
        tmp_path, monkeypatch, down_before_the_end_s, waited_s):
    """A tracker down since long before the end is not waited for another 300 s (a RayJob's GPU nodes would idle
    for nothing); one that went down lately gets the rest of its bound. What it lacks is then a gap, named."""
    from spotray.tracking import follower as follower_module
    from spotray.tracking.tensorboard_sink import TensorboardSink

    clock = [1000.0]

    class Clock:
        time = staticmethod(lambda: clock[0])
        sleep = staticmethod(lambda seconds: clock.__setitem__(0, clock[0] + seconds))

    def down(self, rows):
        raise OSError("the tracker is down")

    monkeypatch.setattr(follower_module, "time", Clock)
    monkeypatch.setattr(TensorboardSink, "rows", down)
    cfg = config.load(None, ["data.path=/unused", f"checkpoint.path={tmp_path / 'runs'}", "run.name=down",
                             "train.max_steps=40", f"train.log_every={LOG_EVERY}",
                             f"tracking.tensorboard.dir={tmp_path / 'tb'}"])
    root, console = run_root(cfg), io.StringIO()
    follower = Follower(cfg, root, stream=console)
    with follower:
        write_attempt(ledger.attempts_root(root), "a", 0, 40, started_at=1000.0)
        assert not follower.poll()  # the outage begins
        clock[0] += down_before_the_end_s
        ended_at = clock[0]
    follower.finish(summary(40))
    assert clock[0] - ended_at == waited_s
    assert [(gap["tracker"], gap["first_step"], gap["last_step"]) for gap in read_gaps(root)] == [
        ("tensorboard", 1, 40)]
    said = console.getvalue().splitlines()
    assert said[0].startswith("spotray: warning: tracking.tensorboard: cannot send to ")
    assert said[1:] == (["spotray: warning: tracking.tensorboard still down as the run ends: waiting up to 200 s more "
                         "(until its outage has lasted 300 s), then what it lacks is dropped"] if waited_s else [])
