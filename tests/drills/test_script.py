"""A user's own script on a real multi-node Ray cluster, run as docs/scripts.md shows: a Hugging Face Trainer with
spotray's two lines, and an Accelerate loop with spotray's calls. A preemption notice costs no step and the run
resumes where the notice's checkpoint left it; a kill costs the steps since the newest committed checkpoint."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spotray.accounts import ledger
from spotray.checkpoints.dcp import checkpoints_root, list_committed
from spotray.drills.cluster import LocalCluster
from spotray.examples import accelerate_loop, hf_finetune
from spotray.storage import Location, resolve
from tests.drills.test_preemption import wait_until
from tests.repo import REPO, readme_example

pytestmark = pytest.mark.cluster  # a real multi-node local Ray cluster (make quick leaves these out)

MAX_STEPS = 40
# A notice takes seconds to reach the workers (Ray drains the node, Ray Train polls every second) while these steps
# take milliseconds: a run with a notice is long enough after step 10 that the notice, and a kill after it, always
# land before the end.
NOTICE_MAX_STEPS = 200


def start_script(project: Path, runs: Path, cluster: LocalCluster, script: str, *script_args: str) -> subprocess.Popen:
    """The command docs/scripts.md shows (for ``script``), with where the run goes and how often it checkpoints."""
    shown = shlex.split(readme_example("script-example"))
    assert shown[:4] == ["spotray", "train", "--script", "finetune.py"], shown
    assert shown[-2:] == ["--max-steps", str(MAX_STEPS)], shown
    at = shown.index("--")
    added = ["--json", "--set", f"checkpoint.path={runs}", "--set", "run.name=drill", "--set",
             "checkpoint.every_steps=10"]
    cmd = [str(Path(sys.executable).parent / "spotray"), "train", "--script", script, *shown[4:at], *added,
           *shown[at:], *script_args]
    with open(project / "summary.json", "w") as out, open(project / "driver.log", "w") as err:
        return subprocess.Popen(cmd, cwd=project, env={**cluster.node_env(), "RAY_ADDRESS": cluster.address},
                                stdout=out, stderr=err)


def run_drill(cluster: LocalCluster, tmp_path, faults: tuple[str, ...],
              example=hf_finetune) -> tuple[dict, str, Location, list[int]]:
    """docs/scripts.md's command on ``example`` (copied into a user's project directory); each fault in turn hits the
    node of a worker once a checkpoint past where the run last started is committed (step 10 at first), and a
    replacement node joins. Returns the summary, the console, the run's root and the newest step committed when each
    fault landed."""
    project, runs = tmp_path / "project", tmp_path / "runs"
    project.mkdir()
    script = "finetune.py" if example is hf_finetune else Path(example.__file__).name
    shutil.copy(example.__file__, project / script)  # the example as a user has it
    root = resolve(str(runs)).child("drill")
    max_steps = NOTICE_MAX_STEPS if "notice" in faults else MAX_STEPS
    driver = start_script(project, runs, cluster, script, "--max-steps", str(max_steps))
    attempts, committed_at_faults = root.child("attempts"), []
    for restarts, fault in enumerate(faults):
        if restarts:  # the restart after the fault before has begun: where it started
            wait_until(lambda n=restarts: len(ledger.read_attempts(attempts)) > n, "the restart", project, driver)
        started_at = ledger.read_attempts(attempts)[-1].from_step if restarts else 9
        wait_until(lambda after=started_at: any(c.step > after for c in list_committed(checkpoints_root(root))),
                   f"a checkpoint past step {started_at}", project, driver)
        (cluster.preempt_with_notice if fault == "notice" else cluster.kill)(cluster.nodes[-1])
        committed_at_faults.append(list_committed(checkpoints_root(root))[0].step)
        cluster.add_node()
    driver.wait(timeout=400)
    console = (project / "driver.log").read_text()
    assert driver.returncode == 0, console[-4000:]
    summary = json.loads((project / "summary.json").read_text())
    assert summary["final_step"] == max_steps
    newest = list_committed(checkpoints_root(root))[0]
    assert newest.step == max_steps and newest.is_files
    return summary, console, root, committed_at_faults


def assert_resumed_at_the_notice(summary: dict, root: Location, *files: str) -> None:
    """The first fault was the notice: it cost no step, and the next attempt started at its step."""
    assert (summary["events"][0]["kind"], summary["events"][0]["lost_steps"]) == ("notice", 0), summary["events"]
    attempts = root.child("attempts")
    first, second, *_ = ledger.read_attempts(attempts)
    assert second.from_step == max(ledger.read_steps(attempts, first.attempt_id)), "resumed at the notice's step"
    newest = list_committed(checkpoints_root(root))[0]
    assert set(files) <= set(newest.files), newest.files


def test_a_trainer_script_loses_no_step_to_a_notice_and_a_kill_costs_it_the_steps_since_its_newest_checkpoint(
        cluster, tmp_path):
    """The notice first, then the kill once the run has resumed and committed a checkpoint past the notice's. The
    Trainer's checkpoint uploads while the next steps train, so a kill during an upload also costs the steps since
    the one before: under two intervals (the next save waits for the upload), as docs/scripts.md says."""
    assert_two_lines_as_in_readme(Path(hf_finetune.__file__))
    summary, console, root, (_, committed_at_kill) = run_drill(cluster, tmp_path, ("notice", "kill"))
    assert_resumed_at_the_notice(summary, root, "files/rng_state_0.pth", "files/rng_state_1.pth",
                                 "files/model.safetensors")
    assert "PREEMPTION NOTICE at step" in console and "RESUMED from step" in console, console
    (_, event) = summary["events"]
    assert event["kind"] == "kill" and 0 <= event["lost_steps"] < 2 * 10, event
    (_, second, third) = ledger.read_attempts(root.child("attempts"))
    assert third.from_step >= committed_at_kill > second.from_step, "resumed from the newest checkpoint at the kill"
    assert third.from_step % 10 == 0, "resumed from a committed interval's step"
    status = subprocess.run([str(Path(sys.executable).parent / "spotray"), "status", root.path],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "notice" in status.stdout and "goodput" in status.stdout, status.stdout


def assert_two_lines_as_in_readme(script: Path) -> None:
    """The two lines docs/scripts.md (Your existing script) shows are the example's, word for word (the example names
    its dataset differently)."""
    page = (REPO / "docs" / "scripts.md").read_text()
    code = script.read_text()
    for call in ("callbacks=[spotray.hf.SpotrayCallback()]", "trainer.train(resume_from_checkpoint=spotray.hf."
                 "resume_checkpoint())"):
        assert call in page and call in code, call


def test_an_accelerate_loop_loses_no_step_to_a_notice_and_resumes_at_it(cluster, tmp_path):
    summary, console, root, _ = run_drill(cluster, tmp_path, ("notice",), accelerate_loop)
    assert_resumed_at_the_notice(summary, root, "files/random_states_0.pkl", "files/random_states_1.pkl",
                                 "files/model.safetensors", "files/optimizer.bin")
    assert "MOVING ON from step" in console, "should_stop() ended the loop once the workers fit elsewhere"
