"""On a CUDA machine: ``spotray bench throughput --gpu`` on the 124M GPT over every visible GPU reports tokens/s
and MFU; its JSON is written under ``$SPOTRAY_GPU_RESULTS`` (default ``gpu-results/``) for BENCHMARKS.md.
Skipped without CUDA."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.gpu.configs import results_dir

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
SPOTRAY = Path(sys.executable).parent / "spotray"


def test_throughput_bench_on_gpu_reports_tokens_per_second_and_mfu():
    workers = torch.cuda.device_count()
    command = [str(SPOTRAY), "bench", "throughput", "--gpu", "--preset", "gpt2-124m", "--workers", str(workers),
               "--steps", "30", "--rounds", "1", "--json"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    out = results_dir() / "bench-throughput-gpt2-124m.json"
    out.write_text(json.dumps({"command": " ".join(["spotray", *command[1:]]), **result}, indent=2) + "\n")

    assert result["gpu"] and result["dtype"] == "bfloat16" and result["machine"]["cuda"]
    assert result["model"] == "gpt2-124m" and result["workers"] == workers
    assert result["spotray_tokens_per_s"] > 0
    assert result["mfu"] is not None and 0 < result["mfu"] < 1, f"MFU {result['mfu']}"
    assert math.isfinite(result["step_time_ratio"]) and result["step_time_ratio"] > 0
