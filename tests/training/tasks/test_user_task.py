"""A user's own model through the task seam (``model.task``): docs/own-model.md's example run as written, through
Ray; exact resume of that example on a process group; and how a broken task is stopped."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from statistics import mean

import pytest
import torch

from spotray import config
from spotray.checkpoints.dcp import read_model_record
from spotray.drills.process_group import train_on_process_group
from spotray.driver import launch
from spotray.errors import TrainingFailed
from spotray.examples import conv_lm
from spotray.storage import resolve
from spotray.worker import attempt
from tests.corpus import write_corpus
from tests.repo import readme_example
from tests.training.runs import cli_env

EXAMPLE = "spotray.examples.conv_lm:make_task"

RAISING_FACTORY = """
def make_task(cfg):
    raise ValueError("width must be even")
"""

MEAN_LOSS_TASK = """
import torch.nn.functional as F

from spotray.examples.conv_lm import ConvLMTask


class MeanLossTask(ConvLMTask):
    def loss(self, model, batch):  # the usual mean loss, counted as one unit: the step's units are not constant
        logits = self.logits(model, batch[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()), 1


def make_task(cfg):
    return MeanLossTask(cfg)
"""


@pytest.mark.e2e
def test_the_readme_example_trains_the_user_task_through_ray(tmp_path, ray_address):
    commands = readme_example("user-task-example")
    write_corpus(tmp_path / "corpus")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=tmp_path,
                          env=cli_env(RAY_ADDRESS=ray_address), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary_json = re.search(r"--summary-json (\S+)", commands)
    steps = re.search(r"train\.max_steps=(\d+)", commands)
    assert summary_json and steps
    summary = json.loads((tmp_path / summary_json.group(1)).read_text())
    max_steps = int(steps.group(1))
    assert summary["final_step"] == max_steps
    losses = [summary["losses"][str(step)] for step in range(1, max_steps + 1)]
    assert mean(losses[-5:]) < mean(losses[:5]) - 0.2, losses
    run_root = resolve(summary["checkpoints"][0].rsplit("/checkpoints/", 1)[0])
    record, _ = read_model_record(run_root)
    assert record is not None and record["task"] == EXAMPLE  # the example trained, not the built-in GPT


def example_config(data: str, ckpt: Path, name: str, *overrides: str) -> config.TrainConfig:
    return config.load(None, [
        f"data.path={data}", f"checkpoint.path={ckpt}", f"run.name={name}", f"model.task={EXAMPLE}",
        "train.seq_len=32", "train.global_batch_size=8", "train.max_steps=20", "train.log_every=5",
        "checkpoint.every_steps=10", "scaling.num_workers=2", "seed=1", *overrides])


def train(cfg: config.TrainConfig) -> dict:
    """The run on a gloo process group; its summary, with every step's loss, from the ledger."""
    train_on_process_group(cfg.to_dict(), cfg.scaling.num_workers)
    return launch.summarize(cfg, num_samples=0, root=attempt.run_root(cfg))


@pytest.mark.e2e
def test_the_example_stopped_at_10_and_resumed_to_20_is_bitwise_identical(dataset_url, tmp_path):
    """Under FSDP: the blocks are sharded one by one. The token-dropout schedule is the task's extra state: were it
    not restored, the resumed steps would drop more tokens than the uninterrupted ones."""
    straight = train(example_config(dataset_url, tmp_path, "straight", "parallel=fsdp"))
    first = train(example_config(dataset_url, tmp_path, "resumed", "parallel=fsdp", "train.stop_at_step=10"))
    assert first["final_step"] == 10
    resumed = train(example_config(dataset_url, tmp_path, "resumed", "parallel=fsdp"))
    assert resumed["final_step"] == 20
    assert resumed["losses"] == straight["losses"]  # exact, not approximately
    assert resumed["param_sha256"] == straight["param_sha256"]


def test_the_example_model_is_causal_and_initialises_every_parameter(dataset_url, tmp_path):
    task = conv_lm.make_task(example_config(dataset_url, tmp_path, "unit"))
    with torch.device("meta"):
        model = task.build_model()
    model.to_empty(device="cpu")
    for param in model.parameters():
        param.detach().fill_(float("nan"))  # what uninitialised memory may hold
    torch.manual_seed(0)
    task.init_weights(model)
    first_init = [p.detach().clone() for p in model.parameters()]
    assert all(p.isfinite().all() for p in first_init)
    torch.manual_seed(0)
    task.init_weights(model)
    assert all(torch.equal(a, b) for a, b in zip(first_init, model.parameters(), strict=True))

    tokens = torch.randint(task.vocab_size, (1, 32))
    changed = tokens.clone()
    changed[0, 20] = (tokens[0, 20] + 1) % task.vocab_size
    with torch.no_grad():
        before, after = model.eval()(tokens), model(changed)
    assert torch.equal(before[:, :20], after[:, :20])  # no position sees a later token
    assert not torch.allclose(before[:, 20], after[:, 20])


def test_a_loss_whose_units_are_not_constant_stops_the_run(dataset_url, tmp_path, monkeypatch):
    (tmp_path / "mean_loss_task.py").write_text(MEAN_LOSS_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned workers start with this process's sys.path
    cfg = example_config(dataset_url, tmp_path / "runs", "mean", "model.task=mean_loss_task:make_task")
    with pytest.raises(TrainingFailed, match="TaskError") as failed:
        train_on_process_group(cfg.to_dict(), 2)
    assert "units" in str(failed.value) and "train.global_batch_size x units_per_sample" in str(failed.value)


BAD_TASKS = {
    "no_such_package.tasks:make_task": "cannot import 'no_such_package.tasks'",
    "training.examples.conv_lm:make_task": "write model.task=spotray.examples.conv_lm:make_task",
    "spotray.examples.conv_lm:no_such_factory": "has no callable 'no_such_factory'",
    "raising_factory:make_task": "raised ValueError: width must be even",
}


@pytest.fixture(scope="module")
def bad_task_runs(dataset_url, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """``spotray train`` with each bad ``model.task``, all at once (each spends its time importing torch and Ray):
    task -> (the finished process, its checkpoint.path)."""
    root = tmp_path_factory.mktemp("bad-tasks")
    (root / "raising_factory.py").write_text(RAISING_FACTORY)
    started = {}
    for i, task in enumerate(BAD_TASKS):
        ckpt = root / f"runs{i}"
        command = [sys.executable, "-m", "spotray.cli", "train", "--set", f"model.task={task}",
                   "--set", f"data.path={dataset_url}", "--set", f"checkpoint.path={ckpt}"]
        started[task] = (subprocess.Popen(command, cwd=root, env=cli_env(PYTHONPATH=str(root)), text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE), ckpt)
    finished = {}
    for task, (proc, ckpt) in started.items():
        stdout, stderr = proc.communicate(timeout=120)
        finished[task] = (subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), ckpt)
    return finished


@pytest.mark.parametrize("task", BAD_TASKS)
@pytest.mark.e2e
def test_a_bad_model_task_stops_the_run_before_anything_is_written(task, bad_task_runs):
    proc, ckpt = bad_task_runs[task]
    assert proc.returncode == 2, proc.stderr[-4000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("spotray: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert "'model.task'" in errors[0] and BAD_TASKS[task] in errors[0], errors[0]
    assert not ckpt.exists()
