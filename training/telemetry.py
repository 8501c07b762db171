"""Rank 0's view of a run while it trains: the attempt's clock in storage, live goodput, log lines and the
Prometheus gauges exported through Ray's metrics agent (``ray.util.metrics``; Ray prefixes them ``ray_``)."""

from __future__ import annotations

import logging
import time

import torch

from training import goodput, ledger
from training.storage import Location

log = logging.getLogger(__name__)

# Dense bf16 tensor-core peak per device, TFLOP/s (vendor data sheets); the longest matching name wins.
PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "L4": 121.0, "A10G": 70.0, "A10": 125.0,
               "T4": 65.0}

GAUGES = {
    "step": "last trained step",
    "loss": "training loss (mean token cross-entropy) at the last logged step",
    "tokens_per_second": "training throughput over the last log interval, all workers",
    "mfu": "model FLOPs utilisation over the last log interval (needs the device's peak FLOP/s)",
    "step_seconds": "mean step time over the last log interval",
    "goodput": "productive step time kept by the final model / wall time since the run started",
    "lost_steps": "steps trained and then lost to interruptions, whole run",
    "interruptions": "worker-group restarts (preemptions, node losses, errors), whole run",
    "checkpoint_blocking_seconds": "time training waited for the last checkpoint save",
    "checkpoint_save_seconds": "end-to-end time of the last checkpoint save",
    "checkpoint_restore_seconds": "time this attempt spent restoring its checkpoint",
    "checkpoint_failed_saves": "failed checkpoint saves in this attempt (storage outages)",
    "emergency_checkpoint": "last preemption notice: 1 if its emergency checkpoint committed, 0 if there was no "
                            "time (the restart falls back to the last committed checkpoint) or it failed",
}


_TRANSPORT_ERRORS = ("gloo", "NCCL", "Connection reset by peer", "Connection closed by peer", "Broken pipe")


def lost_peer(exc: BaseException) -> bool:
    """The error a surviving rank sees when another rank's node vanished mid-collective."""
    from ray.exceptions import RayError

    return (isinstance(exc, (torch.distributed.DistError, RayError))
            or any(m in str(exc) for m in _TRANSPORT_ERRORS))


def peak_flops(configured_tflops: float | None, device: torch.device) -> float | None:
    """Peak FLOP/s of one device: configured, or looked up for known GPUs; None when unknown (CPUs)."""
    if configured_tflops:
        return configured_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    matches = [key for key in PEAK_TFLOPS if key in name]
    return PEAK_TFLOPS[max(matches, key=len)] * 1e12 if matches else None


class Gauges:
    """The run's gauges, tagged with its name; silent outside a Ray worker (e.g. a bare process group)."""

    def __init__(self, run_name: str):
        import ray

        self.tags = {"run": run_name}
        self.gauges = {}
        if ray.is_initialized():
            from ray.util.metrics import Gauge

            self.gauges = {name: Gauge(f"spotray_{name}", text, tag_keys=("run",)) for name, text in GAUGES.items()}

    def set(self, **values: float | None) -> None:
        for name, value in values.items():
            if value is not None and self.gauges:
                self.gauges[name].set(value, tags=self.tags)


class Telemetry:
    """Does nothing on ranks other than 0."""

    def __init__(self, enabled: bool, attempts_root: Location, attempt: ledger.AttemptInfo, entered_at: float,
                 max_steps: int, tokens_per_step: int, flops_per_token: float, peak: float | None, run_name: str,
                 writer: ledger.RecordWriter):
        self.enabled = enabled
        if not enabled:
            return
        self.clock = goodput.AttemptClock(attempts_root, attempt.attempt_id, entered_at, max_steps, writer)
        self.live = goodput.LiveGoodput(attempts_root, attempt.from_step)
        self.gauges = Gauges(run_name)
        self.max_steps, self.tokens_per_step = max_steps, tokens_per_step
        # MFU counts every worker's device
        self.peak_total = peak * attempt.world_size if peak else None
        self.flops_per_token = flops_per_token
        self.productive_s = 0.0
        self.window_steps, self.window_s = 0, 0.0
        history = goodput.account(attempts_root)
        self.gauges.set(interruptions=len(history.events), lost_steps=sum(e.lost_steps for e in history.events))

    def started(self, startup_s: float, restore_s: float) -> None:
        if not self.enabled:
            return
        self.clock.add("startup", startup_s)
        self.clock.add("restore", restore_s)
        self.gauges.set(checkpoint_restore_seconds=restore_s)
        self.clock.flush()

    def step_done(self, seconds: float) -> None:
        if not self.enabled:
            return
        if self.clock.status["first_step_at"] is None:
            self.clock.update(first_step_at=time.time())
        self.productive_s += seconds
        self.window_steps, self.window_s = self.window_steps + 1, self.window_s + seconds

    def logged(self, step: int, loss: float, lr: float, failed_saves: int) -> None:
        """At each log interval: one log line, the gauges and the attempt's status in storage."""
        if not self.enabled:
            return
        tokens_per_s = self.window_steps * self.tokens_per_step / self.window_s if self.window_s else None
        mfu = tokens_per_s * self.flops_per_token / self.peak_total if tokens_per_s and self.peak_total else None
        live = self.live(self.productive_s)
        self.gauges.set(step=step, loss=loss, tokens_per_second=tokens_per_s, mfu=mfu, goodput=live,
                        step_seconds=self.window_s / self.window_steps if self.window_steps else None,
                        checkpoint_failed_saves=failed_saves)
        self.clock.update(step=step, loss=loss, tokens_per_s=tokens_per_s, goodput=live, failed_saves=failed_saves)
        self.clock.flush()
        self.window_steps, self.window_s = 0, 0.0
        log.info("step %d/%d loss %.4f lr %.2e %s goodput %.0f%%%s", step, self.max_steps, loss, lr,
                 f"{tokens_per_s:,.0f} tok/s" if tokens_per_s else "", 100 * live,
                 f" mfu {100 * mfu:.1f}%" if mfu else "")

    def checkpoint(self, blocking_s: float, save_s: float | None) -> None:
        if not self.enabled:
            return
        self.clock.add("checkpoint_save", blocking_s)
        self.gauges.set(checkpoint_blocking_seconds=blocking_s, checkpoint_save_seconds=save_s)

    def notice(self, step: int, at: float, committed: bool) -> None:
        if not self.enabled:
            return
        self.clock.update(notice={"step": step, "at": at, "committed": committed})
        self.gauges.set(emergency_checkpoint=1.0 if committed else 0.0)
        self.clock.flush()

    def drain_wait(self, seconds: float) -> None:
        if self.enabled:
            self.clock.add("drain_wait", seconds)
            self.clock.flush()

    def failed(self, exc: BaseException) -> None:
        """Records why the attempt ended; a collective broken by a vanished peer is the peer's loss, not an error."""
        if self.enabled and not lost_peer(exc):
            self.clock.update(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
            self.clock.flush()

    def finished(self) -> None:
        if self.enabled:
            self.clock.flush()
