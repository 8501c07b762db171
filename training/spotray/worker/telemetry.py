"""Rank 0's view of a run while it trains: the attempt's clock in storage, live goodput, log lines and the
Prometheus gauges exported through Ray's metrics agent (``ray.util.metrics``; Ray prefixes them ``ray_``)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from spotray.accounts import endings, goodput, ledger
from spotray.accounts.cost import LiveCost, gauge_figures
from spotray.formats import step_of
from spotray.storage import Location

if TYPE_CHECKING:
    from spotray.checkpoints.dcp import CommittedCheckpoint

log = logging.getLogger(__name__)

# Dense bf16 tensor-core peak per device, TFLOP/s (vendor data sheets); the longest matching name wins.
PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "L40": 181.0, "L4": 121.0, "A10G": 70.0,
               "A10": 125.0, "T4": 65.0}

GAUGES = {
    "step": "last trained step",
    "loss": "training loss (mean token cross-entropy) at the last logged step",
    "tokens_per_second": "training throughput over the last log interval, all workers",
    "mfu": "model FLOPs utilisation over the last log interval (needs the device's peak FLOP/s)",
    "step_seconds": "mean step time over the last log interval",
    "goodput": "productive step time kept by the final model / wall time since the run started",
    "lost_steps": "steps trained and then lost to interruptions, whole run, as the step records show",
    "lost_steps_at_most": "upper bound of lost_steps: a kill can take up to two log intervals of unwritten records",
    "interruptions": "spot interruptions (a preemption notice, or a spot node lost), whole run; not stops, errors "
                     "or lost drivers",
    "checkpoint_blocking_seconds": "time training waited for the last checkpoint save",
    "checkpoint_save_seconds": "end-to-end time of the last checkpoint save",
    "checkpoint_restore_seconds": "time this attempt spent restoring its checkpoint",
    "checkpoint_failed_saves": "failed checkpoint saves in this attempt (storage outages)",
    "snapshot_step": "step of the newest in-memory snapshot",
    "snapshot_bytes": "the most any node holds for the run's in-memory snapshots",
    "snapshot_capacity_bytes": "the least any node may hold for them (snapshot.max_gb_per_node, or half its room)",
    "emergency_checkpoint": "last preemption notice: 1 if its emergency checkpoint committed, 0 if there was no "
                            "time (the restart falls back to the last committed checkpoint) or it failed",
    "max_steps": "the steps the run plans to train",
    "cost_usd": "what the run's nodes cost so far (training/cost.py's rules), where every node has a price",
    "usd_per_million_tokens": "cost_usd per million tokens trained by the steps the final model kept",
    "on_demand_usd": "the same kept steps on the same instance types on demand, without interruptions",
    "spot_saving_ratio": "1 - cost_usd / on_demand_usd",
    "last_step_timestamp_seconds": "UNIX time of the last logged step",
    "checkpoint_step": "step of the newest committed checkpoint",
    "last_checkpoint_timestamp_seconds": "UNIX time the newest checkpoint committed, or the run started if none has",
    "recovery_seconds": "last interruption until the first step after it",
    "val_loss": "validation loss (mean token cross-entropy on the held-out samples) at the last evaluation",
}
# The run's wall time since it started, by goodput.CATEGORIES (the badput breakdown), under the tag ``category``.
TIME_GAUGE = "time_seconds"
# Each rank's memory at the last logged step, by memory.KINDS without "_bytes", under the tags ``rank`` and ``kind``.
MEMORY_GAUGE = "memory_bytes"


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
    tflops = known_peak_tflops(torch.cuda.get_device_name(device))
    return tflops * 1e12 if tflops else None


def known_peak_tflops(device_name: str) -> float | None:
    """``PEAK_TFLOPS`` of the longest key in the name (``NVIDIA A10G`` is an A10G, not an A10)."""
    matches = [key for key in PEAK_TFLOPS if key in device_name]
    return PEAK_TFLOPS[max(matches, key=len)] if matches else None


class Gauges:
    """The run's gauges, tagged with its name; silent outside a Ray worker (e.g. a bare process group)."""

    def __init__(self, run_name: str):
        import ray

        self.tags = {"run": run_name}
        self.gauges, self.time, self.memory = {}, None, None
        self.latest: dict[str, float] = {}
        if ray.is_initialized():
            from ray.util.metrics import Gauge

            self.gauges = {name: Gauge(f"spotray_{name}", text, tag_keys=("run",)) for name, text in GAUGES.items()}
            self.time = Gauge(f"spotray_{TIME_GAUGE}", "the run's wall time since it started, by category",
                              tag_keys=("run", "category"))
            self.memory = Gauge(f"spotray_{MEMORY_GAUGE}", "each rank's memory at the last logged step: host RSS "
                                "now and at peak, CUDA allocated and reserved peaks", tag_keys=("run", "rank", "kind"))

    def set(self, **values: float | None) -> None:
        """Records the given values and exports every gauge's latest one again: Ray's exporter drops a gauge
        that has not been set for a while, and a run's planned steps or interruptions rarely change."""
        self.latest.update({name: value for name, value in values.items() if value is not None})
        if self.gauges:
            for name, value in self.latest.items():
                self.gauges[name].set(value, tags=self.tags)

    def set_time(self, seconds: dict[str, float]) -> None:
        if self.time:
            for category, value in seconds.items():
                self.time.set(value, tags={**self.tags, "category": category})

    def set_memory(self, figures: dict[str, list[int] | None]) -> None:
        if self.memory:
            for kind, per_rank in figures.items():
                for rank, value in enumerate(per_rank or ()):
                    self.memory.set(value, tags={**self.tags, "rank": str(rank), "kind": kind.removesuffix("_bytes")})


@dataclass(frozen=True)
class Past:
    live: goodput.LiveGoodput
    before: dict[str, float]  # seconds by category before this attempt (``_before_this_attempt``)
    interrupted_at: float | None  # UNIX time the previous attempt was interrupted


class Telemetry:
    """What ranks other than 0 report: nothing. Rank 0 reports through ``RankZeroTelemetry``."""

    def started(self, startup_s: float, restore_s: float, from_snapshot: bool = False) -> None:
        """The attempt's start-up and restore (of an in-memory snapshot, ``from_snapshot``) took this long."""

    def planned(self, max_steps: int) -> None:
        """The run trains to ``max_steps`` (a script's Trainer says so once it starts)."""

    def step_done(self, seconds: float) -> None:
        """A step took ``seconds``."""

    def compiled(self, seconds: float) -> None:
        """``torch.compile`` compiled for ``seconds`` (not counted in the step or evaluation it compiled in)."""

    def logged(self, step: int, loss: float, lr: float, failed_saves: int,
               last_checkpoint: CommittedCheckpoint | None, memory: dict[str, list[int] | None]) -> None:
        """A log interval ended at ``step``; ``memory``: every rank's figures (``memory.all_ranks``)."""

    def evaluated(self, step: int, metrics: dict[str, float], seconds: float) -> None:
        """An evaluation at ``step`` gave ``metrics`` in ``seconds``."""

    def checkpoint(self, blocking_s: float, save_s: float | None) -> None:
        """Training waited ``blocking_s`` for a save that took ``save_s`` end to end."""

    def snapshot(self, blocking_s: float, held: tuple[int, dict[str, tuple[int, int]]] | None) -> None:
        """Training waited ``blocking_s`` for an in-memory snapshot; ``held``: the newest committed one's step and
        each node's bytes held and cap, where one has committed since the last."""

    def notice(self, step: int, at: float, committed: bool, kept_in: str = "checkpoint") -> None:
        """A preemption notice came at ``step``; ``committed``: its emergency save did, kept in a ``checkpoint``
        (storage) or a ``snapshot`` (memory on the nodes that stay)."""

    def drain_wait(self, seconds: float) -> None:
        """Waited this long after an emergency checkpoint for the node to go."""

    def moved(self, at: float) -> None:
        """After its emergency checkpoint the attempt ends at ``at`` to restart on other capacity."""

    def grew(self, step: int, at: float) -> None:
        """The attempt ends at ``at``, its ``step`` committed, to restart with the whole worker group."""

    def failed(self, exc: BaseException) -> None:
        """The attempt ends with ``exc``."""

    def finished(self) -> None:
        """The run is complete."""


class RankZeroTelemetry(Telemetry):
    """Rank 0's view: the attempt's clock in storage, live goodput, log lines and gauges."""

    def __init__(self, *, attempts_root: Location, attempt: ledger.AttemptInfo, entered_at: float,
                 max_steps: int | None,
                 tokens_per_step: int, flops_per_token: float | None, peak: float | None, run_name: str,
                 writer: ledger.RecordWriter, log_every: int = 1):
        self.clock = goodput.AttemptClock(attempts_root, attempt.attempt_id, entered_at, max_steps, writer, log_every)
        self.evals = ledger.eval_log(attempts_root, attempt.attempt_id, writer)
        self.intervals = ledger.interval_log(attempts_root, attempt.attempt_id, writer)
        self.gauges = Gauges(run_name)
        self.cost = LiveCost(attempts_root, attempt)
        self.max_steps, self.tokens_per_step = max_steps, tokens_per_step
        # MFU counts every worker's device
        self.peak_total = peak * attempt.world_size if peak else None
        self.flops_per_token = flops_per_token
        self.productive_s = 0.0
        self.window_steps, self.window_s = 0, 0.0
        self.from_step = attempt.from_step
        self._past: Past | None = None
        # Dozens of small reads on S3: they overlap the first step instead of delaying it.
        pool = ThreadPoolExecutor(1, thread_name_prefix="spotray-history")
        self._history = pool.submit(goodput.account, attempts_root, attempt.attempt_id)
        pool.shutdown(wait=False)  # the thread ends with the read
        self.gauges.set(max_steps=max_steps)

    def past(self) -> Past:
        """The run before this attempt, read from the ledger (waits for the read the constructor started)."""
        if self._past is None:
            history = self._history.result()
            live = goodput.LiveGoodput(history, self.from_step)
            last = history.events[-1] if history.events else None
            interrupted_at = last.interrupted_at if last and last.kind not in endings.PAUSES else None
            self._past = Past(live, _before_this_attempt(history, live.prior_productive), interrupted_at)
            first_step_at = self.clock.status["first_step_at"]
            self.gauges.set(interruptions=len(history.interruptions),
                            lost_steps=sum(e.lost_steps for e in history.events),
                            lost_steps_at_most=sum(e.lost_steps_at_most for e in history.events),
                            recovery_seconds=first_step_at - interrupted_at if first_step_at and interrupted_at
                            else None)
        return self._past

    def planned(self, max_steps: int) -> None:
        self.max_steps = max_steps
        self.clock.update(max_steps=max_steps)
        self.gauges.set(max_steps=max_steps)

    def started(self, startup_s: float, restore_s: float, from_snapshot: bool = False) -> None:
        self.clock.add("startup", startup_s)
        self.clock.add("snapshot_restore" if from_snapshot else "restore", restore_s)
        self.clock.update(from_snapshot=from_snapshot)
        self.gauges.set(checkpoint_restore_seconds=restore_s)
        self.clock.flush()

    def step_done(self, seconds: float) -> None:
        if self.clock.status["first_step_at"] is None:
            # On record at once, not with the first log line: an attempt lost before that has still resumed the run,
            # and its recovery time is the one to report.
            self.clock.update(first_step_at=time.time())
            self.clock.flush()
        self.productive_s += seconds
        self.window_steps, self.window_s = self.window_steps + 1, self.window_s + seconds

    def compiled(self, seconds: float) -> None:
        self.clock.add("compile", seconds)

    def logged(self, step: int, loss: float, lr: float, failed_saves: int,
               last_checkpoint: CommittedCheckpoint | None, memory: dict[str, list[int] | None]) -> None:
        """One log line, the gauges, the interval's record and the attempt's status in storage."""
        tokens_per_s = self.window_steps * self.tokens_per_step / self.window_s if self.window_s else None
        mfu = model_flops_utilization(tokens_per_s, self.flops_per_token, self.peak_total)
        step_s = self.window_s / self.window_steps if self.window_steps else None
        past = self.past()
        live = past.live(self.productive_s)
        self.cost.poke(time.time())
        bill = gauge_figures(self.cost.latest)
        self.intervals.record(step, tokens_per_s=tokens_per_s, mfu=mfu, goodput=live, step_s=step_s, memory=memory,
                              **bill)
        self.gauges.set_memory(memory)
        self.gauges.set(**bill, step=step, loss=loss, tokens_per_second=tokens_per_s, mfu=mfu, goodput=live,
                        step_seconds=step_s,
                        checkpoint_failed_saves=failed_saves, last_step_timestamp_seconds=time.time(),
                        checkpoint_step=last_checkpoint.step if last_checkpoint else None,
                        last_checkpoint_timestamp_seconds=(last_checkpoint.committed_at if last_checkpoint
                                                           else past.live.run_started))
        self.gauges.set_time(self._time_by_category())
        self.clock.update(step=step, loss=loss, tokens_per_s=tokens_per_s, goodput=live, failed_saves=failed_saves)
        self.clock.flush()
        self.window_steps, self.window_s = 0, 0.0
        log.info("step %s loss %.4f lr %.2e %s goodput %.0f%%%s", step_of(step, self.max_steps), loss, lr,
                 f"{tokens_per_s:,.0f} tok/s" if tokens_per_s else "", 100 * live,
                 f" mfu {100 * mfu:.1f}%" if mfu else "")

    def evaluated(self, step: int, metrics: dict[str, float], seconds: float) -> None:
        self.evals.record(step, metrics=metrics, s=round(seconds, 6))
        self.clock.add("eval", seconds)
        self.clock.update(val_loss=metrics.get("val_loss"), val_step=step)
        self.gauges.set(val_loss=metrics.get("val_loss"))
        self.clock.flush()
        log.info("step %s eval %s (%.2fs)", step_of(step, self.max_steps),
                 " ".join(f"{name} {value:.4f}" for name, value in metrics.items()), seconds)

    def checkpoint(self, blocking_s: float, save_s: float | None) -> None:
        self.clock.add("checkpoint_save", blocking_s)
        self.gauges.set(checkpoint_blocking_seconds=blocking_s, checkpoint_save_seconds=save_s)

    def snapshot(self, blocking_s: float, held: tuple[int, dict[str, tuple[int, int]]] | None) -> None:
        self.clock.add("snapshot_save", blocking_s)
        self.clock.update(snapshots=self.clock.status["snapshots"] + 1)
        if held is None or not held[1]:
            return
        step, nodes = held
        self.clock.update(snapshot={"step": step, "nodes": {node: {"bytes": used, "cap": cap}
                                                           for node, (used, cap) in nodes.items()}})
        self.gauges.set(snapshot_step=step, snapshot_bytes=max(used for used, _ in nodes.values()),
                        snapshot_capacity_bytes=min(cap for _, cap in nodes.values()))

    def notice(self, step: int, at: float, committed: bool, kept_in: str = "checkpoint") -> None:
        self.clock.update(notice={"step": step, "at": at, "committed": committed, "kept_in": kept_in})
        self.gauges.set(emergency_checkpoint=1.0 if committed else 0.0)
        self.clock.flush()

    def drain_wait(self, seconds: float) -> None:
        self.clock.add("drain_wait", seconds)
        self.clock.flush()

    def moved(self, at: float) -> None:
        self.clock.update(moved_at=at)
        self.clock.flush()

    def grew(self, step: int, at: float) -> None:
        self.clock.update(grew={"step": step, "at": at})
        self.clock.flush()

    def failed(self, exc: BaseException) -> None:
        """Records why the attempt ended; a collective broken by a vanished peer is the peer's loss, not an error."""
        if not lost_peer(exc):
            self.clock.update(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
            self.clock.flush()

    def finished(self) -> None:
        self.clock.flush()

    def _time_by_category(self) -> dict[str, float]:
        """Earlier attempts plus this one's clock; ``other`` is whatever else the wall time since the start held."""
        status, past = self.clock.status, self.past()
        seconds = dict(past.before)
        seconds["productive"] += self.productive_s
        for category in goodput.CLOCKED:
            seconds[category] += status[f"{category}_s"]
        seconds["waiting"] += status["drain_wait_s"]
        accounted = sum(v for k, v in seconds.items() if k != "other")
        seconds["other"] = max(0.0, time.time() - past.live.run_started - accounted)
        return seconds


def _before_this_attempt(history: goodput.Account, kept_productive: float) -> dict[str, float]:
    """Earlier attempts' seconds by category; their steps past this attempt's start are wasted from now on."""
    seconds = dict(history.seconds)
    seconds["wasted"] += seconds["productive"] - kept_productive
    seconds["productive"] = kept_productive
    return seconds


def model_flops_utilization(tokens_per_s: float | None, flops_per_token: float | None,
                            peak_flops: float | None) -> float | None:
    """None where a figure is unknown: no step timed yet, a task that does not count its FLOPs, a device without
    a known peak."""
    return tokens_per_s * flops_per_token / peak_flops if tokens_per_s and flops_per_token and peak_flops else None
