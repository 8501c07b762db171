"""On a CUDA machine: ``spotray bench throughput --gpu`` on the 124M GPT with GPT-2's vocabulary over every visible
GPU reports tokens/s and MFU, and ``spotray bench compile --gpu`` times a replacement's first step from the kept
compile caches against a cold one; their JSON is written under ``$SPOTRAY_GPU_RESULTS`` (default ``gpu-results/``)
for BENCHMARKS.md. Skipped without CUDA."""

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


def _bench(name: str, *args: str) -> dict:
    """``spotray bench <args> --json``'s result, also written to ``<name>.json`` with its command."""
    command = [str(SPOTRAY), "bench", *args, "--json"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    out = results_dir() / f"{name}.json"
    out.write_text(json.dumps({"command": " ".join(["spotray", *command[1:]]), **result}, indent=2) + "\n")
    return result


def test_throughput_bench_on_gpu_reports_tokens_per_second_and_mfu():
    workers = torch.cuda.device_count()
    result = _bench("bench-throughput-gpt2-124m", "throughput", "--gpu", "--preset", "gpt2-124m", "--vocab-size",
                    "50257", "--workers", str(workers), "--steps", "30", "--rounds", "1")

    assert result["gpu"] and result["dtype"] == "bfloat16" and result["machine"]["cuda"]
    assert result["model"] == "gpt2-124m" and result["workers"] == workers and result["vocab_size"] == 50257
    assert result["spotray_tokens_per_s"] > 0
    assert result["mfu"] is not None and 0 < result["mfu"] < 1, f"MFU {result['mfu']}"
    assert math.isfinite(result["step_time_ratio"]) and result["step_time_ratio"] > 0


def test_a_replacement_on_gpu_takes_its_compiled_graphs_from_the_caches_kept_with_the_run():
    result = _bench("bench-compile-gpt2-124m", "compile", "--gpu", "--preset", "gpt2-124m", "--workers",
                    str(torch.cuda.device_count()), "--rounds", "1")

    assert result["gpu"] and result["machine"]["cuda"]
    assert result["graphs_from_cache"][0] > 0, "the replacement compiled every graph again"
    assert 0 < result["replacement_s"][0] and 0 < result["cold_s"][0]
