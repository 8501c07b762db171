"""A user's own Accelerate training loop, with spotray's calls, on a real multi-node Ray cluster: a preemption
notice costs no step, and the run resumes where the notice's checkpoint left it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spotray import ledger
from spotray.checkpoint import checkpoints_root, list_committed
from spotray.drills.cluster import LocalCluster
from spotray.examples import accelerate_loop
from spotray.storage import resolve
from tests.drills.test_preemption import wait_until

MAX_STEPS = 40


def start_script(project: Path, runs: Path, cluster: LocalCluster) -> subprocess.Popen:
    cmd = [str(Path(sys.executable).parent / "spotray"), "train", "--script", "accelerate_loop.py", "--json",
           "--set", f"checkpoint.path={runs}", "--set", "run.name=acc", "--set", "scaling.num_workers=2",
           "--set", "checkpoint.every_steps=10", "--set", "fault_tolerance.preemption_check_every_steps=1",
           "--", "--max-steps", str(MAX_STEPS)]
    return subprocess.Popen(cmd, cwd=project, env={**cluster.node_env(), "RAY_ADDRESS": cluster.address},
                            stdout=open(project / "summary.json", "w"), stderr=open(project / "driver.log", "w"))  # noqa: SIM115


@pytest.mark.slow
def test_an_accelerate_loop_loses_no_step_to_a_notice_and_resumes_at_it(tmp_path):
    project, runs = tmp_path / "project", tmp_path / "runs"
    project.mkdir()
    shutil.copy(accelerate_loop.__file__, project / "accelerate_loop.py")  # the example as a user has it
    root = resolve(str(runs)).child("acc")
    with LocalCluster(tmp_path / "ray-logs", drain_timeout_s=20).start(workers=2) as cluster:
        driver = start_script(project, runs, cluster)
        wait_until(lambda: any(c.step >= 10 for c in list_committed(checkpoints_root(root))),
                   "a checkpoint of step 10", project, driver)
        cluster.preempt_with_notice(cluster.nodes[-1])
        cluster.add_node()
        driver.wait(timeout=400)
    console = (project / "driver.log").read_text()
    assert driver.returncode == 0, console[-4000:]
    summary = json.loads((project / "summary.json").read_text())
    assert summary["final_step"] == MAX_STEPS
    assert [(e["kind"], e["lost_steps"]) for e in summary["events"]] == [("notice", 0)], summary["events"]
    attempts = root.child("attempts")
    (first, second) = ledger.read_attempts(attempts)
    assert second.from_step == max(ledger.read_steps(attempts, first.attempt_id)), "resumed at the notice's step"
    newest = list_committed(checkpoints_root(root))[0]
    assert newest.step == MAX_STEPS and newest.is_files
    assert {"files/random_states_0.pkl", "files/random_states_1.pkl", "files/model.safetensors",
            "files/optimizer.bin"} <= set(newest.files), newest.files
