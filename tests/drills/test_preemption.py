"""Preemption drills on a real multi-node Ray cluster (``ray start`` processes on this machine)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotray import config
from spotray.accounts import ledger
from spotray.checkpoints.dcp import checkpoints_root, list_committed, read_model_record
from spotray.drills.cluster import LocalCluster
from spotray.drills.process_group import train_on_process_group
from spotray.storage import resolve
from tests.console import assert_quiet_console
from tests.training.tasks.test_hf_causal_lm import TINY

MAX_STEPS = 120

pytestmark = pytest.mark.cluster  # a real multi-node local Ray cluster (make quick leaves these out)


def drill_settings(dataset_url: str, ckpt: str) -> list[str]:
    return [f"data.path={dataset_url}", f"checkpoint.path={ckpt}", "run.name=drill", "model.preset=tiny",
            "train.seq_len=32", "train.global_batch_size=12", f"train.max_steps={MAX_STEPS}", "train.log_every=1",
            "checkpoint.every_steps=20", "checkpoint.keep_last=10", "scaling.num_workers=2",
            "fault_tolerance.preemption_check_every_steps=2"]


def start_training(dataset_url: str, tmp_path, cluster: LocalCluster, *extra: str,
                   cwd: Path | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "spotray.cli", "train", "--summary-json", str(tmp_path / "summary.json"),
           "--audit-dir", str(tmp_path / "audit")]
    for arg in [*drill_settings(dataset_url, f"{tmp_path}/ckpt"), *extra]:
        cmd += ["--set", arg]
    log = open(tmp_path / "driver.log", "a")  # noqa: SIM115 - a rerun appends
    return subprocess.Popen(cmd, cwd=cwd, env={**cluster.node_env(), "RAY_ADDRESS": cluster.address}, stdout=log,
                            stderr=subprocess.STDOUT)


def wait_until(appeared, what: str, tmp_path, driver: subprocess.Popen, timeout_s: float = 180) -> None:
    """Until ``appeared()``, while the driver runs; else the test fails with the driver's log."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and driver.poll() is None:
        if appeared():
            return
        time.sleep(0.2)
    pytest.fail(f"{what} did not appear; driver log:\n{(tmp_path / 'driver.log').read_text()[-3000:]}")


def wait_for_checkpoint(tmp_path, step: int, driver: subprocess.Popen) -> None:
    root = checkpoints_root(resolve(f"{tmp_path}/ckpt").child("drill"))
    wait_until(lambda: any(c.step >= step for c in list_committed(root)), f"a checkpoint of step {step}", tmp_path,
               driver)


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
    return [(a.from_step, max(ledger.read_steps(root, a.attempt_id), default=a.from_step))
            for a in ledger.read_attempts(root)]


def run_drill(cluster: LocalCluster, dataset_url: str, tmp_path, inject, expected_kind: str,
              *extra: str, cwd: Path | None = None) -> tuple[int, int]:
    """Train, call ``inject(victim)`` once step 20 is committed, add a replacement node, and check the run
    finished with every sample trained exactly once over two attempts. Returns (last step of the first
    attempt, step the second attempt resumed from)."""
    driver = start_training(dataset_url, tmp_path, cluster, *extra, cwd=cwd)
    wait_for_checkpoint(tmp_path, 20, driver)
    inject(cluster.nodes[-1])
    cluster.add_node()  # the replacement spot node
    summary = finish(driver, tmp_path)
    assert summary["final_step"] == MAX_STEPS
    assert summary["audit"]["exactly_once"], summary["audit"]
    history = attempts_and_last_steps(tmp_path)
    assert len(history) == 2, history
    assert [e["kind"] for e in summary["events"]] == [expected_kind], summary["events"]
    (_, first_last), (second_from, _) = history
    return first_last, second_from


def test_preemption_with_notice_loses_no_steps_with_a_transformers_model(cluster, dataset_url, tmp_path):
    """A tiny Llama (the built-in GPT's notice is drilled by the demo's test)."""
    llama = [f"model.hf.config.{key}={value}" for key, value in TINY["llama"].items()]
    first_last, second_from = run_drill(cluster, dataset_url, tmp_path, cluster.preempt_with_notice, "notice",
                                        *llama)
    record, _ = read_model_record(resolve(f"{tmp_path}/ckpt").child("drill"))
    assert record is not None and record["task"] == "hf"
    # The notice lands between periodic saves, or on one, which is then reused rather than rewritten.
    assert second_from == first_last, f"resumed at {second_from} but the first attempt reached {first_last}"
    driver_log = (tmp_path / "driver.log").read_text()
    assert "PREEMPTION NOTICE at step" in driver_log and "RESUMED from step" in driver_log, driver_log[-3000:]
    # The replacement node joined before the 20 s drain deadline: the workers moved there instead of waiting.
    assert_quiet_console(driver_log, "MOVING ON from step")


def test_a_run_without_nodes_for_its_workers_says_it_waits_once_and_trains_when_they_join(cluster, dataset_url,
                                                                                          tmp_path):
    for node in cluster.nodes[1:]:  # the head alone, as Ray sees it: no CPU for a worker
        if node.alive:
            cluster.kill(node)
    assert cluster.settled(), "Ray still lists a killed node as alive"
    driver = start_training(dataset_url, tmp_path, cluster)
    waiting = "spotray: WAITING for capacity: 2 workers of 1 CPU each"
    wait_until(lambda: waiting in (tmp_path / "driver.log").read_text(), repr(waiting), tmp_path, driver)
    cluster.add_node()
    cluster.add_node()
    summary = finish(driver, tmp_path)
    assert summary["final_step"] == MAX_STEPS and summary["audit"]["exactly_once"], summary["audit"]
    console = (tmp_path / "driver.log").read_text()
    assert_quiet_console(console, "the cluster has 0 CPU free and no node big enough for one worker")
    assert console.count("WAITING for capacity") == 1, console


SHIPPED_TASK = """
import os

from mypkg.data import WIDTH  # a package named data: it travels like any other
from spotray.examples import conv_lm


def make_task(cfg):
    with open(os.path.join(cfg.checkpoint.path, "imported-from.txt"), "a") as record:
        print(os.path.dirname(os.path.abspath(__file__)), file=record)
    assert WIDTH == 64
    return conv_lm.make_task(cfg)
"""


def write_project(project: Path) -> Path:
    """A user's project: a task module that exists only here, its own package named data, and packages named like
    spotray's folders that fail if anything imports them."""
    (project / "mypkg" / "data").mkdir(parents=True)
    (project / "mypkg" / "__init__.py").write_text("")
    (project / "mypkg" / "data" / "__init__.py").write_text("WIDTH = 64\n")
    (project / "mytask.py").write_text(SHIPPED_TASK)
    for name in ("training", "infra", "cluster", "monitoring", "data"):
        (project / name).mkdir()
        (project / name / "__init__.py").write_text(f"raise ImportError('the project\\'s own {name} was imported')\n")
    return project


def imported_on_workers(run_dir: Path, project: Path) -> list[str]:
    """Where the workers imported the task module from (``SHIPPED_TASK`` records it), asserting it was the package
    each node unpacked (``runtime_env.enter_working_dir``)."""
    imported_from = (run_dir / "imported-from.txt").read_text().splitlines()
    on_workers = [where for where in imported_from if where != str(project)]
    assert all(Path(where).parent.parts[-2:] == ("spotray", "code") for where in on_workers), imported_from
    return on_workers


def test_a_kill_costs_a_shipped_project_at_most_one_interval_and_its_package_shadows_nothing(
        cluster, dataset_url, tmp_path, monkeypatch):
    """A user's project with packages named like spotray's folders, run from its own directory: the task that
    exists only there trains on 2 workers, a node is killed without notice a few steps past a checkpoint, and the
    run resumes bitwise from that checkpoint on the package each node unpacked, losing at most one interval; no
    worker imports the task from anywhere else. With ``max_failures=0``: a spot kill spends the preemption budget
    (Ray Train alone would charge it to max_failures and end the run)."""
    def kill_after_a_few_more_steps(node):
        time.sleep(1.0)  # steps past the checkpoint, which the restart must recompute
        cluster.kill(node)

    project = write_project(tmp_path / "project")
    (tmp_path / "ckpt").mkdir()
    shipped = ("runtime.working_dir=.", "model.task=mytask:make_task")
    first_last, second_from = run_drill(cluster, dataset_url, tmp_path, kill_after_a_few_more_steps, "kill",
                                        *shipped, "fault_tolerance.max_failures=0", cwd=project)
    assert second_from % 20 == 0, "with no notice, the restart resumes from a periodic checkpoint"
    assert 0 <= first_last - second_from <= 20, f"lost {first_last - second_from} steps, more than one interval"
    assert [p.suffix for p in (tmp_path / "ckpt" / "drill" / "code").iterdir()] == [".zip"]  # one package, reused
    assert len(imported_on_workers(tmp_path / "ckpt", project)) >= 4  # 2 workers in each of 2 attempts
    (tmp_path / "straight").mkdir()
    monkeypatch.syspath_prepend(str(project))  # the uninterrupted run's ranks import the task from the project
    straight = train_on_process_group(config.load(None, [*drill_settings(dataset_url, str(tmp_path / "straight")),
                                                         shipped[1]]).to_dict(), 2)
    assert json.loads((tmp_path / "summary.json").read_text())["param_sha256"] == straight["param_sha256"]
