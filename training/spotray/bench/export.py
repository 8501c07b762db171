"""``spotray bench export``: ``spotray export`` of a 2-rank FSDP checkpoint: seconds, and peak memory against the
model's bytes, measured in a fresh process (its baseline is the interpreter with torch imported)."""

from __future__ import annotations

import json
import subprocess
import sys

from spotray import config
from spotray.bench.common import bench_corpus, machine, scratch_dir
from spotray.drills.process_group import train_on_process_group

_MEASURE = """
import json, math, resource, sys, time
from spotray.checkpoints.dcp import checkpoints_root, list_committed, model_tensors
from spotray.export import export
from spotray.storage import resolve
run, out = sys.argv[1:3]
shapes = model_tensors(list_committed(checkpoints_root(resolve(run)))[0])
model_bytes = sum(dtype.itemsize * math.prod(shape) for dtype, shape in shapes.values())
baseline_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
export(run, out)
seconds = time.perf_counter() - started
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"model_bytes": model_bytes, "baseline_kb": baseline_kb, "peak_kb": peak_kb, "seconds": seconds}))
"""


def run(preset: str = "gpt2-124m") -> dict:
    with scratch_dir() as workdir:
        cfg = config.load(None, [f"data.path={bench_corpus(workdir)}", f"checkpoint.path={workdir}/ckpt",
                                 f"model.preset={preset}", "run.name=export", "parallel=fsdp", "scaling.num_workers=2",
                                 "train.seq_len=256", "train.global_batch_size=2", "train.max_steps=1"])
        train_on_process_group(cfg.to_dict(), 2)
        proc = subprocess.run([sys.executable, "-c", _MEASURE, f"{workdir}/ckpt/export", f"{workdir}/out"],
                              capture_output=True, text=True, timeout=1800, check=True)
        measured = json.loads(proc.stdout.strip().splitlines()[-1])
    model_bytes, baseline, peak = measured["model_bytes"], measured["baseline_kb"] * 1024, measured["peak_kb"] * 1024
    return {
        "machine": machine(), "model": preset, "checkpoint": "2-rank FSDP", "model_mb": round(model_bytes / 1e6, 1),
        "export_s": round(measured["seconds"], 2), "peak_rss_mb": round(peak / 1e6, 1),
        "baseline_rss_mb": round(baseline / 1e6, 1),
        "peak_rss_over_model": round(peak / model_bytes, 3),
        "export_rss_growth_over_model": round((peak - baseline) / model_bytes, 3),
    }
