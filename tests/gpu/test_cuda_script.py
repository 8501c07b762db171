"""On a CUDA machine: a Hugging Face Trainer script with ``fsdp`` in its TrainingArguments, through ``spotray train
--script`` on every visible GPU: its sharded checkpoint is committed, and a second run resumes from it. Skipped
without CUDA (Accelerate shards with FSDP on GPUs only)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spotray.accounts import ledger
from spotray.checkpoints.dcp import checkpoints_root, list_committed
from spotray.examples import hf_finetune
from spotray.storage import resolve
from tests.training.runs import cli_env

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_a_trainer_script_with_fsdp_commits_its_sharded_checkpoint_and_resumes_from_it(tmp_path):
    shutil.copy(hf_finetune.__file__, tmp_path / "finetune.py")
    gpus = torch.cuda.device_count()

    def train(max_steps: int) -> dict:
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "spotray"), "train", "--script", "finetune.py", "--json",
             "--set", f"checkpoint.path={tmp_path / 'runs'}", "--set", "run.name=fsdp", "--set",
             f"scaling.num_workers={gpus}", "--set", "scaling.use_gpu=true", "--set", "checkpoint.every_steps=10",
             "--", "--max-steps", str(max_steps), "--fsdp"],
            cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(proc.stdout)

    assert train(10)["final_step"] == 10
    root = resolve(str(tmp_path / "runs")).child("fsdp")
    (checkpoint,) = list_committed(checkpoints_root(root))
    assert any("fsdp" in name for name in checkpoint.files), sorted(checkpoint.files)  # the sharded model's files
    assert train(20)["final_step"] == 20
    attempts = ledger.read_attempts(root.child("attempts"))
    assert [a.from_step for a in attempts] == [0, 10]
