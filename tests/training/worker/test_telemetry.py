"""MFU's peak lookup, how an attempt ended, when its first step is on record, and the gauges on Ray's Prometheus
endpoint."""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest
import torch

from spotray.accounts import goodput, ledger
from spotray.driver import launch
from spotray.storage import resolve
from spotray.worker.telemetry import (
    GAUGES,
    MEMORY_GAUGE,
    TIME_GAUGE,
    RankZeroTelemetry,
    known_peak_tflops,
    lost_peer,
    model_flops_utilization,
    peak_flops,
)
from tests.training.configs import make_config


def test_a_collective_broken_by_a_vanished_peer_is_not_an_application_error():
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:30417: Connection reset by peer")
    assert lost_peer(gloo)
    assert lost_peer(torch.distributed.DistNetworkError("store unreachable"))
    assert not lost_peer(FloatingPointError("loss is nan at step 7: lower train.lr or check the data"))


def test_peak_flops_is_configured_or_unknown_on_cpu():
    assert peak_flops(989.0, torch.device("cpu")) == 989e12
    assert peak_flops(None, torch.device("cpu")) is None


def test_mfu_is_unknown_when_the_task_counts_no_flops_or_the_device_has_no_peak():
    assert model_flops_utilization(1e5, 6e8, 1e15) == pytest.approx(0.06)
    assert model_flops_utilization(1e5, None, 1e15) is None
    assert model_flops_utilization(1e5, 6e8, None) is None
    assert model_flops_utilization(None, 6e8, 1e15) is None


@pytest.mark.parametrize(("device_name", "tflops"), [
    ("NVIDIA A10", 125.0), ("NVIDIA A10G", 70.0), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 NVL", 989.4), ("NVIDIA H200", 989.4), ("NVIDIA L4", 121.0),
    ("NVIDIA L40", 181.0), ("NVIDIA L40S", 362.1), ("Tesla T4", 65.0), ("NVIDIA GeForce RTX 4090", None),
])
def test_a_gpu_gets_its_own_peak_not_that_of_a_shorter_name_inside_its_own(device_name, tflops):
    assert known_peak_tflops(device_name) == tflops


def scrape_spotray_gauges(port: int) -> set[str]:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return set()
    return {line.split("{")[0] for line in text.splitlines() if line.startswith("ray_spotray_")}


def rank_zero(attempts, info: ledger.AttemptInfo, writer: ledger.RecordWriter) -> RankZeroTelemetry:
    """Rank 0's telemetry of attempt ``info``, recorded under ``attempts``."""
    ledger.write_attempt(attempts, info)
    return RankZeroTelemetry(attempts_root=attempts, attempt=info, entered_at=time.time(), max_steps=100,
                             tokens_per_step=512, flops_per_token=None, peak=None, run_name="r", writer=writer,
                             log_every=10)


def test_an_attempts_first_step_is_on_record_before_its_first_log_line(tmp_path):
    """A kill before the attempt's first log line must still find it resumed: `spotray status` and the driver measure
    the interruption's recovery to its first step."""
    attempts, writer = resolve(str(tmp_path / "attempts")), ledger.RecordWriter()
    telemetry = rank_zero(attempts, ledger.AttemptInfo("a1", 20, 2, 4), writer)
    telemetry.started(startup_s=1.0, restore_s=0.5)
    before = time.time()
    telemetry.step_done(0.1)
    writer.close(timeout_s=10)
    status = goodput.read_status(attempts, "a1")
    assert status is not None and status["first_step_at"] >= before and status["step"] is None


def test_each_snapshot_is_counted_with_its_blocked_time_so_a_plan_can_take_one_snapshots_cost(tmp_path):
    attempts, writer = resolve(str(tmp_path / "attempts")), ledger.RecordWriter()
    telemetry = rank_zero(attempts, ledger.AttemptInfo("a1", 0, 2, 4), writer)
    telemetry.snapshot(0.25, None)  # the first: no snapshot before it is held yet
    telemetry.snapshot(0.5, (10, {"node-a": (1024, 4096)}))
    telemetry.clock.flush()
    writer.close(timeout_s=10)
    status = goodput.read_status(attempts, "a1")
    assert status is not None and (status["snapshots"], status["snapshot_save_s"]) == (2, 0.75)


@pytest.mark.e2e
def test_rank0_gauges_reach_rays_prometheus_endpoint_while_training(ray_cluster, dataset_url, tmp_path):
    # priced nodes, as the demo's: the cost gauges are exported only where every node has a price
    priced = {"node": {"instance_type": "g5.xlarge", "capacity_type": "spot"},
              "prices": {"g5.xlarge": {"spot": 0.45, "on-demand": 1.006}}}
    cfg = make_config(dataset_url, str(tmp_path / "ckpt"), "metrics", "train.max_steps=400", "train.log_every=5",
                      "checkpoint.every_steps=100", "eval.every_steps=50", f"data.val_path={dataset_url}",
                      "snapshot.every_steps=20", cost=priced)
    run = threading.Thread(target=launch.run, args=(cfg,), daemon=True)
    run.start()
    seen: set[str] = set()
    # no peak FLOP/s for a CPU, no preemption notice and no interruption in this run
    expected = {f"ray_spotray_{name}" for name in [*GAUGES, TIME_GAUGE, MEMORY_GAUGE]} - {
        "ray_spotray_mfu", "ray_spotray_emergency_checkpoint", "ray_spotray_recovery_seconds"}
    while run.is_alive() and not expected <= seen:
        seen |= scrape_spotray_gauges(ray_cluster)
        time.sleep(0.5)
    run.join(timeout=300)
    assert expected <= seen, f"missing: {sorted(expected - seen)}"
