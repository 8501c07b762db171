"""Preemption drills on a real multi-node Ray cluster (``ray start`` processes on this machine)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from training import ledger
from training.checkpoint import checkpoints_root, list_committed
from training.drills.cluster import LocalCluster
from training.storage import resolve

MAX_STEPS = 120


def start_training(dataset_url: str, tmp_path, cluster: LocalCluster) -> subprocess.Popen:
    args = [
        f"data.path={dataset_url}", f"checkpoint.path={tmp_path}/ckpt", "run.name=drill", "model.preset=tiny",
        "train.seq_len=32", "train.global_batch_size=12", f"train.max_steps={MAX_STEPS}", "train.log_every=1",
        "checkpoint.every_steps=20", "checkpoint.keep_last=10", "scaling.num_workers=2",
        "fault_tolerance.preemption_check_every_steps=2",
    ]
    cmd = [sys.executable, "-m", "training.cli", "train", "--summary-json", str(tmp_path / "summary.json"),
           "--audit-dir", str(tmp_path / "audit")]
    for arg in args:
        cmd += ["--set", arg]
    log = open(tmp_path / "driver.log", "w")  # noqa: SIM115
    return subprocess.Popen(cmd, env={**cluster.node_env(), "RAY_ADDRESS": cluster.address}, stdout=log,
                            stderr=subprocess.STDOUT)


def wait_for_checkpoint(tmp_path, step: int, driver: subprocess.Popen, timeout_s: float = 180) -> None:
    root = checkpoints_root(resolve(f"{tmp_path}/ckpt").child("drill"))
    deadline = time.time() + timeout_s
    while time.time() < deadline and driver.poll() is None:
        if any(c.step >= step for c in list_committed(root)):
            return
        time.sleep(0.2)
    pytest.fail(f"no checkpoint of step {step} appeared; driver log:\n{(tmp_path / 'driver.log').read_text()[-3000:]}")


def finish(driver: subprocess.Popen, tmp_path, timeout_s: float = 400) -> dict:
    try:
        driver.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        driver.kill()
    log = (tmp_path / "driver.log").read_text()
    assert driver.returncode == 0, log[-4000:]
    return json.loads((tmp_path / "summary.json").read_text())


def attempts_and_last_steps(tmp_path) -> list[tuple[int, int]]:
    """(resumed-from step, last step trained) per attempt, from the run's ledger."""
    root = resolve(f"{tmp_path}/ckpt").child("drill", "attempts")
    out = []
    for attempt in ledger.read_attempts(root):
        log = root.child(attempt.attempt_id, "losses.jsonl")
        steps = [json.loads(line)["step"] for line in log.read_text().splitlines()] if log.exists() else []
        out.append((attempt.from_step, max(steps, default=attempt.from_step)))
    return out


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(tmp_path / "ray-logs", drain_timeout_s=20).start(workers=2) as c:
        yield c


def run_drill(cluster: LocalCluster, dataset_url: str, tmp_path, inject) -> tuple[int, int]:
    """Train, call ``inject(victim)`` once step 20 is committed, add a replacement node, and check the run
    finished with every sample trained exactly once over two attempts. Returns (last step of the first
    attempt, step the second attempt resumed from)."""
    driver = start_training(dataset_url, tmp_path, cluster)
    wait_for_checkpoint(tmp_path, 20, driver)
    inject(cluster.nodes[-1])
    cluster.add_node()  # the replacement spot node
    summary = finish(driver, tmp_path)
    assert summary["final_step"] == MAX_STEPS
    assert summary["audit"]["exactly_once"], summary["audit"]
    history = attempts_and_last_steps(tmp_path)
    assert len(history) == 2, history
    (_, first_last), (second_from, _) = history
    return first_last, second_from


def test_preemption_with_notice_loses_no_steps(cluster, dataset_url, tmp_path):
    first_last, second_from = run_drill(cluster, dataset_url, tmp_path, cluster.preempt_with_notice)
    # The notice lands between periodic saves, or on one, which is then reused rather than rewritten.
    assert second_from == first_last, f"resumed at {second_from} but the first attempt reached {first_last}"


@pytest.mark.slow
def test_node_killed_without_notice_loses_at_most_one_checkpoint_interval(cluster, dataset_url, tmp_path):
    def kill_after_a_few_more_steps(node):
        time.sleep(1.0)  # steps past the checkpoint, which the restart must recompute
        cluster.kill(node)

    first_last, second_from = run_drill(cluster, dataset_url, tmp_path, kill_after_a_few_more_steps)
    assert second_from % 20 == 0, "with no notice, the restart resumes from a periodic checkpoint"
    assert 0 <= first_last - second_from <= 20, f"lost {first_last - second_from} steps, more than one interval"


@pytest.mark.slow
def test_head_loss_ends_the_run_and_the_same_command_resumes_on_a_new_cluster(dataset_url, tmp_path):
    with LocalCluster(tmp_path / "ray-logs-1").start(workers=2) as first:
        driver = start_training(dataset_url, tmp_path, first)
        wait_for_checkpoint(tmp_path, 20, driver)
        first.kill(first.nodes[0])  # the head, with its GCS
        try:
            driver.wait(timeout=180)  # the driver gives up; it does not reconnect forever
        except subprocess.TimeoutExpired:
            driver.kill()
            pytest.fail("the driver kept running after the Ray head died")
        assert driver.returncode != 0
    with LocalCluster(tmp_path / "ray-logs-2").start(workers=2) as second:  # a RayJob retry: a new cluster
        summary = finish(start_training(dataset_url, tmp_path, second), tmp_path)
    assert summary["final_step"] == MAX_STEPS
    assert summary["audit"]["exactly_once"], summary["audit"]
    history = attempts_and_last_steps(tmp_path)
    (_, first_last), (second_from, _) = history[0], history[-1]
    assert second_from % 20 == 0 and 0 <= first_last - second_from <= 20, history
