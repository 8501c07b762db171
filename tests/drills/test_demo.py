"""`spotray demo`, shortened: both interruptions happen, are reported, and the run still trains every sample once;
after the notice's emergency checkpoint the workers move to the replacement node instead of waiting. It evaluates,
and logs to MLflow (a real server on loopback), TensorBoard and W&B (offline): each holds one run whose series is
an uninterrupted run's."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import pytest

from infra.cli import main
from spotray import config
from spotray.accounts import goodput, ledger
from spotray.storage import resolve
from tests.console import assert_full_log, assert_quiet_console, line_kind, the_log
from tests.trackers import (
    assert_one_point_per_step,
    mlflow_points,
    mlflow_runs,
    mlflow_server_fixture,  # noqa: F401 - the mlflow_server fixture
    series,
    tensorboard_points,
    wandb_files,
    wandb_points,
    wandb_records,
)
from tests.training.runs import train_locally

SHORTER = {"train.max_steps": 150, "checkpoint.every_steps": 25, "train.log_every": 5}


@pytest.mark.cluster
def test_demo_survives_a_notice_and_a_kill_and_reports_them(tmp_path, capfd, mlflow_server, demo_workdir):
    trackers = {"tracking.mlflow.uri": mlflow_server.url, "tracking.mlflow.experiment": "demo",
                "tracking.tensorboard.dir": str(tmp_path / "tb"), "tracking.wandb.project": "demo",
                "tracking.wandb.mode": "offline"}
    overrides = [arg for key, value in {**SHORTER, **trackers}.items() for arg in ("--set", f"{key}={value}")]
    assert main(["demo", "--workdir", demo_workdir, "--json", str(tmp_path / "demo.json"), *overrides]) == 0
    written = json.loads((tmp_path / "demo.json").read_text())
    assert written["injected"] == ["notice", "kill"]
    events = written["events"]
    assert [e["kind"] for e in events] == ["notice", "kill"], events  # from the evidence: the notice, Ray's reason
    assert "UNEXPECTED_TERMINATION" in events[1]["reason"] and all(e["spot"] for e in events)
    assert events[0]["lost_steps"] == events[0]["lost_steps_at_most"] == 0  # exact after a committed notice
    # The kill goes back to the newest snapshot (every 10 steps), or the one before while the newest was copying.
    assert events[1]["from_snapshot"] and 0 <= events[1]["lost_steps"] <= 2 * 10, events[1]
    assert events[1]["lost_steps_at_most"] == events[1]["lost_steps"] + 2 * 5 - 1  # two log intervals unwritten
    attempts = resolve(demo_workdir).child(written["run_name"], "attempts")
    noticed = goodput.read_status(attempts, ledger.read_attempts(attempts)[0].attempt_id)
    assert noticed is not None
    assert noticed["moved_at"] is not None and noticed["drain_wait_s"] < 20  # not the 20 s drain deadline
    assert all(e["recovery_s"] > 0 for e in events)
    assert written["exactly_once"] is True and written["final_step"] == 150
    assert 0 < written["goodput"] < 1 and written["final_loss"] < 5.5
    assert open(written["loss_curve_png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert sorted(int(step) for step in written["evals"]) == list(range(25, 151, 25))  # keep_best: each checkpoint
    assert written["best"]["val_loss"] == min(e["val_loss"] for e in written["evals"].values())
    bill = written["cost"]  # the demo's example prices, for every node the workers held (3 at least: 2 replacements)
    assert bill["example_prices"] and bill["usd"] > 0 and 0 < bill["usd_per_million_tokens"], bill
    assert bill["nodes_interrupted"] == 2 and len(bill["nodes"]) >= 3 and bill["on_demand_usd"] > 0, bill
    out, err = capfd.readouterr()
    assert "(example prices)" in out, out
    assert_quiet_console(out + err, "PREEMPTION NOTICE at step", "MOVING ON from step",
                         "SPOT INTERRUPTION without notice at step", "loss curve: ")
    assert [line_kind(line) for line in err.splitlines()].count("recovery") == 3  # the move and two resumptions
    run_root = Path(demo_workdir) / written["run_name"]
    assert_full_log(the_log(run_root, err), last_step=150)

    uninterrupted = _uninterrupted_losses(run_root, tmp_path / "straight")
    assert ledger.lineage_losses(attempts) == uninterrupted
    _assert_trackers_hold_one_uninterrupted_run(written, uninterrupted, mlflow_server.url, tmp_path / "tb", run_root)


def float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def _uninterrupted_losses(run_root: Path, elsewhere: Path) -> dict[int, float]:
    """The demo's config on a bare process group, without interruptions, trackers or audit."""
    cfg = config.load(str(run_root / "config.yaml"))
    cfg = dataclasses.replace(cfg, audit_dir=None, tracking=config.TrackingSection(),
                              checkpoint=dataclasses.replace(cfg.checkpoint, path=str(elsewhere)))
    return {int(step): loss for step, loss in train_locally(cfg)["losses"].items()}


def _assert_trackers_hold_one_uninterrupted_run(written: dict, uninterrupted: dict[int, float], mlflow_uri: str,
                                                tensorboard_dir: Path, run_root: Path) -> None:
    [run] = mlflow_runs(mlflow_uri, "demo")
    assert run.info.status == "FINISHED"
    losses = mlflow_points(mlflow_uri, run.info.run_id, "train/loss")
    assert_one_point_per_step(losses)
    assert series(losses) == uninterrupted
    assert [step for step, _ in mlflow_points(mlflow_uri, run.info.run_id, "val/loss")] == list(range(25, 151, 25))
    assert run.data.params["train.max_steps"] == "150"
    assert mlflow_points(mlflow_uri, run.info.run_id, "cost/usd"), "the live cost reaches the trackers"
    assert run.data.metrics["summary/cost_usd"] == written["cost"]["usd"]
    ends = [k for k in run.data.tags if k.startswith("spotray.ending.")]
    assert len(ends) == 2 and '"kind": "notice"' in run.data.tags["spotray.ending.1"]
    assert run.data.metrics["summary/spot_interruptions"] == 2

    board = tensorboard_points(tensorboard_dir / written["run_name"], "train/loss")
    assert_one_point_per_step(board)
    assert series(board) == {step: float32(loss) for step, loss in uninterrupted.items()}  # TensorBoard keeps float32

    wandb_dir = run_root / "wandb"  # offline: W&B's records of every driver of the run
    [run_id] = {path.name.split("-")[-1] for path in wandb_dir.glob("offline-run-*")}
    files = wandb_files(wandb_dir, run_id)
    assert files and all(r.run.run_id == run_id for path in files for r in wandb_records(path) if r.HasField("run"))
    points = wandb_points(wandb_dir, run_id, "train/loss")
    assert_one_point_per_step(points)
    assert series(points) == uninterrupted
