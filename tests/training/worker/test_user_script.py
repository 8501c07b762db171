"""``spotray train --script``'s bad input: one line each, exit 2 where it is an error, nothing in storage touched."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from unittest.mock import ANY

import pytest
import torch
import torch.distributed as dist

import spotray
from infra.cli import main
from spotray import config
from spotray.checkpoints.dcp import COMMIT_MARKER, FILES_FORMAT, list_committed
from spotray.drills.process_group import run_on_process_group
from spotray.errors import ConfigError, SpotrayError
from spotray.storage import resolve
from spotray.worker.attempt import WorkerEnv
from spotray.worker.user_script import run_on_worker
from tests.training.runs import cli_env
from tests.training.worker.test_session import script_config


def spotray_train(cwd: Path, ray_address: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "spotray"), "train", *args], cwd=cwd,
                          env=cli_env(RAY_ADDRESS=ray_address), capture_output=True, text=True, timeout=300)


def listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")} if root.exists() else {}


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("spotray: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize(("text", "expected"), [(None, "finetune.py is not a file"),
                                                ("def broken(:\n", "finetune.py line 1: SyntaxError")])
def test_a_missing_or_broken_script_is_refused_before_anything_starts(tmp_path, capsys, text, expected):
    if text is not None:
        (tmp_path / "finetune.py").write_text(text)
    runs = tmp_path / "runs"
    assert main(["train", "--script", str(tmp_path / "finetune.py"), "--set", f"checkpoint.path={runs}"]) == 2
    assert expected in one_error_line(capsys.readouterr().err) and not runs.exists()


def committed_script_checkpoint(runs: Path, world_size: int = 2) -> None:
    """A script's step 10, committed by ``world_size`` workers."""
    step = runs / "s" / "checkpoints" / "step_000000010"
    (step / "files").mkdir(parents=True)
    (step / "files" / "rng_state_0.pth").write_bytes(b"x")
    (step / COMMIT_MARKER).write_text(json.dumps({"step": 10, "world_size": world_size, "format": FILES_FORMAT,
                                                  "files": {"files/rng_state_0.pth": {"size": 1, "crc32": 0}}}))


def test_a_world_size_change_is_refused_unless_allowed_and_nothing_is_touched(tmp_path, capsys):
    (tmp_path / "finetune.py").write_text("print('trained')\n")
    runs = tmp_path / "runs"
    committed_script_checkpoint(runs)
    before = listing(runs)
    code = main(["train", "--script", str(tmp_path / "finetune.py"), "--set", f"checkpoint.path={runs}",
                 "--set", "run.name=s", "--set", "scaling.num_workers=3"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and "scaling.num_workers" in line and "saved by 2" in line and "allow_world_size_change" in line
    assert listing(runs) == before


def test_status_lists_a_scripts_checkpoint_and_export_refuses_it_in_one_line(tmp_path, capsys):
    committed_script_checkpoint(tmp_path / "runs")
    run = str(tmp_path / "runs" / "s")
    assert main(["status", run]) == 0 and "step 10 (1 B, script files" in capsys.readouterr().out
    assert main(["export", run, "--out", str(tmp_path / "model")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "step 10 holds a training script's own files" in line and not (tmp_path / "model").exists()


NEEDS_A_SCRIPT = "only with --script FILE (a script's arguments follow `--script FILE --`)"


@pytest.mark.parametrize(("argv", "said"), [
    (["--debug"], f"--debug: {NEEDS_A_SCRIPT}"),
    (["--", "--max-steps", "4"], f"the arguments --max-steps 4: {NEEDS_A_SCRIPT}"),
    (["my.yaml"], "my.yaml: give a config file with --config my.yaml"),
    (["finetune.py"], "finetune.py: run a script with --script finetune.py (its arguments after --)"),
])
def test_script_arguments_and_debug_need_a_script_and_a_config_or_script_given_bare_is_named(argv, said, capsys):
    assert main(["train", *argv]) == 2
    assert one_error_line(capsys.readouterr().err) == f"spotray: error: {said}"


@pytest.mark.e2e
def test_a_script_that_raises_at_import_ends_in_one_line_naming_the_rank_and_the_log(tmp_path, ray_address):
    project = tmp_path / "project"
    project.mkdir()
    (project / "finetune.py").write_text("import json\n\nraise KeyError('text')\n")
    proc = spotray_train(project, ray_address, "--script", "finetune.py", "--set",
                         f"checkpoint.path={tmp_path / 'runs'}", "--set", "scaling.num_workers=1", "--set",
                         "fault_tolerance.max_failures=0")
    line = one_error_line(proc.stderr)
    assert proc.returncode == 2, proc.stderr[-3000:]
    log = line.split("(log: ")[1].rstrip(")")
    assert line.startswith("spotray: error: rank 0: KeyError: 'text' (log: ") and Path(log).is_file(), line
    assert "Traceback" in Path(log).read_text(), "the traceback is in the log"
    assert not (tmp_path / "runs" / "spotray" / "checkpoints").exists()


@pytest.mark.e2e
def test_a_trainer_script_run_again_once_finished_trains_nothing_and_says_so(tmp_path, ray_address):
    """Resumed mid-epoch at its max_steps, the Trainer would train one step more before it checks max_steps."""
    project, runs = tmp_path / "project", tmp_path / "runs"
    project.mkdir()
    shutil.copy(Path(spotray.__file__).parent / "examples" / "hf_finetune.py", project / "finetune.py")
    summaries = []
    for again in (False, True):
        summaries.append(tmp_path / f"summary-{again}.json")
        proc = spotray_train(project, ray_address, "--script", "finetune.py", "--set", f"checkpoint.path={runs}",
                             "--set", "scaling.num_workers=1", "--summary-json", str(summaries[-1]), "--",
                             "--max-steps", "5", "--save-steps", "3")
        assert proc.returncode == 0, proc.stderr[-3000:]
        said = "spotray: run 'spotray' finished at step 5 already: nothing to train (raise the script's max steps"
        assert (said in proc.stderr) == again, proc.stderr[-3000:]
        assert "not an interruption" not in proc.stderr, "a rerun that trains nothing continued nothing"
    first, rerun = (json.loads(path.read_text()) for path in summaries)
    assert [c.step for c in list_committed(resolve(str(runs / "spotray" / "checkpoints")))] == [5, 3]
    assert (rerun["final_step"], rerun["final_loss"]) == (first["final_step"], first["final_loss"]) == (5, ANY)
    assert first["final_loss"] is not None  # logged at step 5 (logging_steps=5)


def test_a_config_error_names_the_key():
    with pytest.raises(ConfigError, match="script.args"):
        from spotray import config

        config.from_dict({"script": {"path": "x.py", "args": ["--epochs", 3]}})
    assert issubclass(ConfigError, SpotrayError)


TORCHRUN_SCRIPT = """
import torch
import torch.distributed as dist
from torch.distributed import destroy_process_group, init_process_group

import spotray

init_process_group(backend="gloo")  # as under torchrun, where the script makes the group
spotray.restore("ckpt", max_steps=1)
total = torch.ones(1)
dist.all_reduce(total)
spotray.report(1, loss=float(total))
destroy_process_group()
"""


def torchrun_script_rank(rank: int, world_size: int, project: str) -> bool:
    raw = {**script_config(Path(project) / "runs"), "script": {"path": str(Path(project) / "train.py")}}
    run_on_worker(config.from_dict(raw), WorkerEnv(rank, world_size, torch.device("cpu"), lambda _: None))
    return dist.is_initialized()


def test_a_script_written_for_torchrun_makes_and_destroys_its_group_in_vain_and_trains(tmp_path):
    """Its init_process_group joins the group Ray Train made (before: "trying to initialize the default process
    group twice", every attempt), and its destroy_process_group leaves that group to the session, which ends after
    the script."""
    (tmp_path / "train.py").write_text(TORCHRUN_SCRIPT)
    assert run_on_process_group(torchrun_script_rank, (str(tmp_path),), 2) is True
    assert dist.init_process_group.__module__ == "torch.distributed.distributed_c10d", "put back after the script"
