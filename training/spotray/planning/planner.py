"""``spotray estimate``: should this run use spot? Expected goodput, wall time and dollars on spot and on-demand, at
one or several cluster sizes, before the run starts (``--from RUN_URL`` takes the times from a real run's ledger).

The model, per size of N nodes (first order; every figure is an expectation, not a distribution):
- Interruptions: each node is interrupted at ``interruptions_per_node_hour``; the run, which loses every worker's
  progress when any node goes, at N times that (per hour of wall time). On-demand at
  ``on_demand_interruptions_per_node_hour`` (default 0: the counterfactual with no interruptions).
- The checkpoint interval is what ``checkpoint.every_steps: auto`` chooses at the run's rate:
  ``interval.interval_steps(blocking_save_s, save_s, step_s, N x rate, steps)``, or ``every_steps`` where one is set.
  With a rate of 0 (on-demand), ``auto`` saves once, at the end (the final commit): no periodic saves beyond what
  ``every_steps`` sets. Saves: ceil(steps / interval), each blocking ``blocking_save_s``.
- Each interruption costs: half an interval of steps, plus the in-flight part of the last save (``save_s -
  blocking_save_s``: an interruption before an asynchronous save commits loses the interval before it too), plus
  ``restart_s`` (replacement capacity + start-up) and ``restore_s``. A share ``notice_share`` of interruptions come
  with a notice long enough for an emergency checkpoint: those lose one whole save instead of the steps.
- In-memory snapshots (``snapshot_s`` on ``step_nodes``, each blocking training that long, x step_nodes / N on N
  nodes as each node's shard shrinks; every ``snapshot_every_steps`` or what ``snapshot.every_steps: auto``
  chooses, spread over each checkpoint interval, none where it is longer): an interruption without notice loses half a
  snapshot interval instead of
  half a checkpoint interval, and restores from the surviving nodes' memory (its time is in the restart's start-up),
  not from storage. Checkpoints keep their own interval: they cover the losses snapshots do not (the head, two nodes
  at once), which are not modelled.
- Going on with the survivors (``shrink``): with no warm spare to take over, an interruption costs a restart on the
  survivors (``restart_s - capacity_wait_s``, no wait), the capacity wait at one node less (``capacity_wait_s /
  N`` of the run's throughput), and a second restart when the run grows back (right after a snapshot or checkpoint,
  so it loses no steps).
- Wall time W = productive + saves + startup + overhead + (N x rate x W) x loss, so W = base / (1 - N x rate x loss);
  the run never finishes where N x rate x loss >= 1. Goodput = productive / W (productive: steps x step_s).
  Given a count of ``interruptions`` instead of a rate (replaying a run), W = base + count x loss, and ``auto``
  plans for count / W.
- Dollars = N x W hours x price per node-hour, plus ``warm_spares`` x W hours x the same price on spot;
  $/Mtok = dollars / (tokens / 1e6). A warm spare pays for itself when its idle cost (spares x W x price) is below
  the recovery it saves: N x (restart_s - warm_spare_restart_s) x price x expected interruptions.
- Size: ``step_s`` and ``tokens_per_step`` (the global batch, a recipe fixed across sizes) are measured on
  ``step_nodes`` nodes; on N nodes a step takes step_s x step_nodes / N (ideal scaling: tokens/s per node stays the
  same). Save and restore times are the checkpoint's bytes over the storage bandwidth per node times N, where
  ``checkpoint_bytes`` is given (every node writes and reads its share at once); else the times given, measured, or
  the bench defaults below, at every size.
Not modelled: a second interruption during a recovery or while the run is short of a node, scaling efficiency below
1, a cap on the storage's total bandwidth, billing rules (AWS does not charge a spot instance it interrupts in its
first hour).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from spotray.errors import SpotrayError
from spotray.worker.cadence import interval_steps, snapshot_interval_steps, snapshot_spacing

CAPACITIES = ("spot", "on-demand")
# Defaults from BENCHMARKS.md, GPT-2 124M shape (1025 MB of params + AdamW state), cpu-2c, local dir:
# `spotray bench checkpoint --preset gpt2-124m --storage local` (2026-11-22): sync save blocked 1.926 s at 536 MB/s
# checkpoint write; async blocked 0.163 s, 0.085 of sync. `spotray bench recovery --preset gpt2-124m` (2026-11-23):
# spotray's restore took 1.2 s (1025 MB: 854 MB/s).
BENCH_SAVE_S = 1.926
BENCH_ASYNC_BLOCKED_RATIO = 0.085
BENCH_RESTORE_S = 1.2
BENCH_WRITE_BYTES_PER_S = 536e6
BENCH_READ_BYTES_PER_S = 1025e6 / BENCH_RESTORE_S
COUNT_ITERATIONS = 100  # fixed point of wall time <-> the rate auto plans for, given a count of interruptions


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _fail(name: str, problem: str, fix: str) -> SpotrayError:
    return SpotrayError(f"{_flag(name)}: {problem}; {fix}")


@dataclass(frozen=True)
class Inputs:
    """What ``spotray estimate`` plans from; each field is the flag of the same name (``step_s``: ``--step-s``)."""

    step_s: float  # seconds per training step on ``step_nodes`` nodes
    tokens_per_step: float  # the global batch, in tokens
    restart_s: float  # interruption -> training again: replacement capacity + start-up
    nodes: tuple[int, ...] = (1,)
    tokens: float | None = None  # the run's size: tokens, or ``steps``
    steps: int | None = None
    step_nodes: int | None = None  # where step_s was measured; default: the first of ``nodes``
    interruptions_per_node_hour: float | None = None  # the spot pool's rate
    interruptions: int | None = None  # or a count of interruptions (replaying a run at one size)
    on_demand_interruptions_per_node_hour: float = 0.0
    every_steps: int | None = None  # None: auto
    blocking_save_s: float | None = None  # training blocked per save; default: save_s (sync) or the bench ratio
    save_s: float | None = None  # a whole save, end to end
    restore_s: float | None = None
    async_save: bool = False
    checkpoint_bytes: float | None = None
    storage_bytes_per_s: float | None = None  # per node, read and write
    startup_s: float | None = None  # the run's first start; default restart_s
    capacity_wait_s: float | None = None  # the part of restart_s spent waiting for replacement capacity
    warm_spare_restart_s: float | None = None  # restart_s without a capacity wait (a warm spare, or on the survivors)
    warm_spares: int = 0  # idle spot nodes held for the run (billed on the spot rows)
    notice_share: float = 0.0  # interruptions with a notice long enough for an emergency checkpoint
    snapshot_s: float | None = None  # blocking per snapshot on step_nodes (x step_nodes / N); None: off
    snapshot_every_steps: int | None = None  # with snapshots; None: auto
    shrink: bool = False  # go on with the survivors (scaling.min_workers) instead of waiting for capacity
    overhead_s_per_step: float = 0.0  # wall time per step outside the step (evaluation, logging)
    spot_price: float | None = None  # USD per node-hour
    on_demand_price: float | None = None
    warm_spare_price: float | None = None  # USD per spare node-hour; default: the row's price (a spot spare)

    def __post_init__(self):
        for name in ("step_s", "tokens_per_step"):
            _positive(self, name, "give the measured figure, or --from RUN_URL")
        _at_least_zero(self, "restart_s", "seconds from an interruption to training again (capacity + start-up)")
        if not self.nodes or any(not isinstance(n, int) or n < 1 for n in self.nodes):
            raise _fail("nodes", f"must be node counts of at least 1, got {self.nodes!r}", "e.g. --nodes 8,64,512")
        if (self.tokens is None) == (self.steps is None):
            raise _fail("tokens", "give the run's size once: --tokens N or --steps N", "e.g. --tokens 1T")
        if self.tokens is not None:
            _positive(self, "tokens", "e.g. --tokens 1T")
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise _fail("steps", f"must be at least 1, got {self.steps!r}", "give the run's training steps")
        if self.step_nodes is not None and self.step_nodes < 1:
            raise _fail("step_nodes", f"must be at least 1, got {self.step_nodes}", "the nodes --step-s was timed on")
        rate, count = self.interruptions_per_node_hour, self.interruptions
        if rate is None and count is None:
            raise _fail("interruptions_per_node_hour", "is required: the spot pool's interruptions per node-hour",
                        "e.g. 0.001 (the pool's history, or spotray status of a run on it)")
        if rate is not None and count is not None:
            raise _fail("interruptions", "give a rate or a count, not both", "a count replays one run")
        if rate is not None:
            _at_least_zero(self, "interruptions_per_node_hour", "e.g. 0.001")
        if count is not None:
            if not isinstance(count, int) or count < 0:
                raise _fail("interruptions", f"must be a count of at least 0, got {count!r}", "e.g. 2")
            if len(self.nodes) != 1:
                raise _fail("interruptions", "a count fits one run at one size", "give one --nodes size, or a rate")
        if self.every_steps is not None and (not isinstance(self.every_steps, int) or self.every_steps < 1):
            raise _fail("every_steps", f"must be at least 1 or auto, got {self.every_steps!r}", "e.g. 500 or auto")
        for name in ("on_demand_interruptions_per_node_hour", "blocking_save_s", "save_s", "restore_s",
                     "checkpoint_bytes", "startup_s", "capacity_wait_s", "warm_spare_restart_s",
                     "overhead_s_per_step", "spot_price", "on_demand_price", "warm_spare_price"):
            _at_least_zero(self, name, "give a number >= 0, or leave it out")
        _positive(self, "storage_bytes_per_s", "e.g. --storage-gb-s 2 (GB/s per node)", optional=True)
        if self.save_s is not None and self.blocking_save_s is not None and self.blocking_save_s > self.save_s:
            raise _fail("blocking_save_s", f"{self.blocking_save_s:g} s is longer than the whole save "
                        f"(--save-s {self.save_s:g})", "a save cannot block longer than it takes")
        for name in ("capacity_wait_s", "warm_spare_restart_s"):
            value = getattr(self, name)
            if value is not None and value > self.restart_s:
                raise _fail(name, f"{value:g} s is longer than --restart-s {self.restart_s:g}",
                            "it is a part of the restart")
        if not isinstance(self.warm_spares, int) or self.warm_spares < 0:
            raise _fail("warm_spares", f"must be a count of at least 0, got {self.warm_spares!r}", "e.g. 1")
        if self.warm_spares and self.spare_restart_s is None:
            raise _fail("warm_spares", "needs the restart time a spare gives",
                        "give --capacity-wait-s (the wait a spare removes) or --warm-spare-restart-s")
        if not 0.0 <= self.notice_share <= 1.0:
            raise _fail("notice_share", f"must be between 0 and 1, got {self.notice_share}", "e.g. 0.9")
        _at_least_zero(self, "snapshot_s", "seconds a snapshot blocks training, or leave it out (no snapshots)")
        if self.snapshot_every_steps is not None:
            if not isinstance(self.snapshot_every_steps, int) or self.snapshot_every_steps < 1:
                raise _fail("snapshot_every_steps", f"must be at least 1 or auto, got {self.snapshot_every_steps!r}",
                            "e.g. 10 or auto")
            if self.snapshot_s is None:
                raise _fail("snapshot_every_steps", "needs the time a snapshot blocks training",
                            "give --snapshot-s (spotray bench throughput's snapshot figure, or your own)")
        if self.shrink and self.spare_restart_s is None:
            raise _fail("shrink", "needs the restart on the survivors, which waits for no capacity",
                        "give --capacity-wait-s (the wait it removes) or --warm-spare-restart-s")

    @property
    def reference_nodes(self) -> int:
        return self.step_nodes or self.nodes[0]

    @property
    def total_steps(self) -> int:
        if self.steps is not None:
            return self.steps
        assert self.tokens is not None  # __post_init__ requires one of tokens and steps
        return math.ceil(self.tokens / self.tokens_per_step)

    @property
    def spare_restart_s(self) -> float | None:
        if self.warm_spare_restart_s is not None:
            return self.warm_spare_restart_s
        return None if self.capacity_wait_s is None else self.restart_s - self.capacity_wait_s


def _positive(inputs: Inputs, name: str, fix: str, optional: bool = False) -> None:
    value = getattr(inputs, name)
    if optional and value is None:
        return
    if not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise _fail(name, f"must be a number above 0, got {value!r}", fix)


def _at_least_zero(inputs: Inputs, name: str, fix: str) -> None:
    value = getattr(inputs, name)
    if value is not None and (not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value)):
        raise _fail(name, f"must be a number >= 0, got {value!r}", fix)


@dataclass(frozen=True)
class WarmSpare:
    """Whether ``spares`` warm spares pay for themselves: their idle cost against the recovery they save."""

    spares: int
    idle_usd: float | None
    saves_usd: float | None

    @property
    def pays(self) -> bool | None:
        return None if self.idle_usd is None or self.saves_usd is None else self.idle_usd < self.saves_usd

    def to_dict(self) -> dict:
        return {"spares": self.spares, "idle_usd": _round(self.idle_usd, 2), "saves_usd": _round(self.saves_usd, 2),
                "pays": self.pays}


@dataclass(frozen=True)
class Plan:
    """One size on one capacity type. ``wall_s`` None: the run never finishes (it is interrupted faster than it
    recovers)."""

    nodes: int
    capacity: str
    steps: int
    tokens: float
    step_s: float
    interval_steps: int
    snapshot_interval_steps: int | None  # None: snapshots off
    interruptions_per_hour: float  # the run's, that auto plans for
    expected_interruptions: float | None
    loss_per_interruption_s: float
    save_s: float
    blocking_save_s: float
    restore_s: float
    restart_s: float
    seconds: dict[str, float]  # productive, checkpoint_save, snapshot, startup, overhead, interrupted
    wall_s: float | None
    price: float | None
    usd: float | None
    warm_spare: WarmSpare | None  # None: no interruptions, or no warm-spare restart time to compare with

    @property
    def goodput(self) -> float:
        return self.seconds["productive"] / self.wall_s if self.wall_s else 0.0

    @property
    def usd_per_mtok(self) -> float | None:
        return None if self.usd is None else self.usd / (self.tokens / 1e6)

    def to_dict(self) -> dict:
        return {"nodes": self.nodes, "capacity": self.capacity, "goodput": round(self.goodput, 4),
                "wall_s": _round(self.wall_s, 1), "usd": _round(self.usd, 2),
                "usd_per_mtok": _round(self.usd_per_mtok, 4), "interval_steps": self.interval_steps,
                "snapshot_interval_steps": self.snapshot_interval_steps,
                "interruptions_per_hour": round(self.interruptions_per_hour, 6),
                "expected_interruptions": _round(self.expected_interruptions, 2),
                "loss_per_interruption_s": round(self.loss_per_interruption_s, 2), "steps": self.steps,
                "tokens": self.tokens, "step_s": round(self.step_s, 6), "save_s": round(self.save_s, 3),
                "blocking_save_s": round(self.blocking_save_s, 3), "restore_s": round(self.restore_s, 3),
                "restart_s": round(self.restart_s, 2), "price_usd_per_node_hour": self.price,
                "seconds": {k: round(v, 1) if math.isfinite(v) else None for k, v in self.seconds.items()},
                "warm_spare": self.warm_spare.to_dict() if self.warm_spare else None}


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def plan(inputs: Inputs) -> list[Plan]:
    """For each size in ``inputs.nodes``: the spot plan, then the on-demand one."""
    return [_plan(inputs, nodes, capacity) for nodes in inputs.nodes for capacity in CAPACITIES]


def save_times(inputs: Inputs, nodes: int) -> tuple[float, float, float]:
    """(blocking, whole save, restore) seconds on ``nodes`` nodes: given times win; else the checkpoint's bytes over
    the storage bandwidth per node x nodes; else the bench's figures. A save blocks all of it (sync) unless it is
    asynchronous (the bench's async/sync ratio) or ``blocking_save_s`` is given."""
    if inputs.checkpoint_bytes is not None:
        write = inputs.storage_bytes_per_s or BENCH_WRITE_BYTES_PER_S
        read = inputs.storage_bytes_per_s or BENCH_READ_BYTES_PER_S
        bench_save, bench_restore = inputs.checkpoint_bytes / (write * nodes), inputs.checkpoint_bytes / (read * nodes)
    else:
        bench_save, bench_restore = BENCH_SAVE_S, BENCH_RESTORE_S
    save = inputs.save_s if inputs.save_s is not None else bench_save
    if inputs.blocking_save_s is not None:
        blocking = inputs.blocking_save_s
        save = max(save, blocking) if inputs.save_s is None else save
    else:
        blocking = save * BENCH_ASYNC_BLOCKED_RATIO if inputs.async_save else save
    restore = inputs.restore_s if inputs.restore_s is not None else bench_restore
    return blocking, save, restore


BENCH_SOURCE = "the 2-core dev machine's local-disk bench (GPT-2 124M, BENCHMARKS.md)"


def defaults_used(inputs: Inputs) -> list[str]:
    """The figures the plan takes from ``BENCH_SOURCE`` because nothing given or measured sets them, each with the
    flags that would: none of them is a GPU cluster's."""
    sized = inputs.checkpoint_bytes is not None
    bandwidth = "the storage's bandwidth per node (give --storage-gb-s)"
    used = []
    if inputs.save_s is None and inputs.blocking_save_s is None and not sized:
        used.append(f"the save time, {BENCH_SAVE_S:g} s (give --save-s, or --checkpoint-gb with --storage-gb-s)")
    if inputs.blocking_save_s is None and inputs.async_save:
        used.append(f"an async save's blocking share, {BENCH_ASYNC_BLOCKED_RATIO:g} (give --blocking-save-s)")
    if inputs.restore_s is None and not sized:
        used.append(f"the restore time, {BENCH_RESTORE_S:g} s (give --restore-s, or --checkpoint-gb with "
                    "--storage-gb-s)")
    if sized and inputs.storage_bytes_per_s is None and (inputs.save_s is None or inputs.restore_s is None):
        used.append(bandwidth)
    return used


def _plan(inputs: Inputs, nodes: int, capacity: str) -> Plan:
    spot = capacity == "spot"
    steps = inputs.total_steps
    step_s = inputs.step_s * inputs.reference_nodes / nodes
    blocking, save, restore = save_times(inputs, nodes)
    spares = inputs.warm_spares if spot else 0
    restart = inputs.spare_restart_s if spares and inputs.spare_restart_s is not None else inputs.restart_s
    per_step = step_s + inputs.overhead_s_per_step
    startup = inputs.restart_s if inputs.startup_s is None else inputs.startup_s

    snapshot_s = snapshot_time(inputs, nodes)
    recovery = restart if spares else _recovery_without_spare(inputs, nodes)

    def every(rate_per_hour: float) -> _Intervals:
        if inputs.every_steps is not None:
            checkpoints = min(inputs.every_steps, steps)
        else:
            checkpoints = interval_steps(blocking, save, step_s, rate_per_hour, steps) if rate_per_hour > 0 else steps
        return _Intervals(checkpoints, _snapshot_interval(snapshot_s, inputs.snapshot_every_steps, step_s,
                                                          rate_per_hour, steps, checkpoints))

    def loss(interval: _Intervals) -> float:
        if interval.snapshots is None or interval.snapshots > interval.checkpoints:  # most kills still read storage
            steps_lost, restored = interval.checkpoints / 2 * per_step + max(0.0, save - blocking), restore
        else:
            steps_lost, restored = min(interval.checkpoints, interval.snapshots) / 2 * per_step, 0.0
        return (1 - inputs.notice_share) * steps_lost + inputs.notice_share * save + restored + recovery

    def seconds(interval: _Intervals, interrupted: float) -> dict[str, float]:
        snapshots = 0.0 if interval.snapshots is None else math.ceil(steps / interval.snapshots) * (snapshot_s or 0.0)
        return {"productive": steps * step_s, "checkpoint_save": math.ceil(steps / interval.checkpoints) * blocking,
                "snapshot": snapshots, "startup": startup, "overhead": steps * inputs.overhead_s_per_step,
                "interrupted": interrupted}

    count = inputs.interruptions if spot else None
    wall: float | None
    expected: float | None
    if count is not None:  # replay: W = base + count x loss, auto planning for count / W
        wall, interval = sum(seconds(every(0.0), 0.0).values()), every(0.0)
        for _ in range(COUNT_ITERATIONS):
            rate = count / (wall / 3600)
            interval = every(rate)
            split = seconds(interval, count * loss(interval))
            wall, previous = sum(split.values()), wall
            if abs(wall - previous) < 1e-9 * wall:
                break
        expected = float(count)
    else:
        per_node = inputs.interruptions_per_node_hour if spot else inputs.on_demand_interruptions_per_node_hour
        assert per_node is not None  # __post_init__ requires a rate where there is no count
        rate = per_node * nodes
        interval = every(rate)
        base = sum(seconds(interval, 0.0).values())
        lost_share = rate * loss(interval) / 3600
        wall = base / (1 - lost_share) if lost_share < 1 else None
        expected = rate * wall / 3600 if wall is not None else None
        split = seconds(interval, wall - base if wall is not None else math.inf)
    price = inputs.spot_price if spot else inputs.on_demand_price
    spare_price = price if inputs.warm_spare_price is None else inputs.warm_spare_price
    usd = None
    if price is not None and wall is not None and (spare_price is not None or not spares):
        usd = (nodes * price + spares * (spare_price or 0.0)) * wall / 3600
    return Plan(nodes, capacity, steps, steps * inputs.tokens_per_step, step_s, interval.checkpoints,
                interval.snapshots, rate, expected, loss(interval), save, blocking, restore, restart, split, wall,
                price, usd,
                _warm_spare(inputs, nodes, spares, price, spare_price, wall, expected))


def _recovery_without_spare(inputs: Inputs, nodes: int) -> float:
    """Seconds of the run's throughput an interruption costs past its lost steps, with no warm spare: a restart
    that waits for capacity; or, going on with the survivors, a restart on them, the wait at one node less, and a
    restart to grow back."""
    if not inputs.shrink or nodes == 1:
        return inputs.restart_s
    survivors_restart = inputs.spare_restart_s
    assert survivors_restart is not None  # __post_init__ requires it with shrink
    wait = inputs.restart_s - survivors_restart if inputs.capacity_wait_s is None else inputs.capacity_wait_s
    return 2 * survivors_restart + wait / nodes


def snapshot_time(inputs: Inputs, nodes: int) -> float | None:
    """Seconds a snapshot blocks training on ``nodes`` nodes: each node copies its shard of the state, which shrinks
    as the state is sharded over more nodes; None: snapshots off."""
    return None if inputs.snapshot_s is None else inputs.snapshot_s * inputs.reference_nodes / nodes


class _Intervals(NamedTuple):
    checkpoints: int
    snapshots: int | None  # None: off; a fixed interval longer than the checkpoints' is counted for its cost only


def _snapshot_interval(snapshot_s: float | None, every_steps: int | None, step_s: float, rate_per_hour: float,
                       steps: int, checkpoints: int) -> int | None:
    """Steps between snapshots: ``every_steps``, else what ``snapshot.every_steps: auto`` chooses at the run's
    interruption rate, spread over each interval of ``checkpoints`` steps; None: off, or none fit between
    checkpoints."""
    if snapshot_s is None:
        return None
    if every_steps is not None:
        return min(every_steps, steps)
    return snapshot_spacing(min(snapshot_interval_steps(snapshot_s, snapshot_s, step_s, rate_per_hour), steps),
                            checkpoints)


def _warm_spare(inputs: Inputs, nodes: int, spares: int, price: float | None, spare_price: float | None,
                wall: float | None, expected: float | None) -> WarmSpare | None:
    """Idle cost of the spares (``warm_spares``, else one) against the recovery time they save the run's nodes.
    With one price for both, the price cancels out: the verdict turns on nodes, rate and the seconds saved."""
    warm = inputs.spare_restart_s
    if warm is None or not expected:
        return None
    spares = spares or 1
    if price is None or spare_price is None or wall is None:
        return WarmSpare(spares, None, None)
    saved_s = _recovery_without_spare(inputs, nodes) - warm
    return WarmSpare(spares, spares * wall / 3600 * spare_price, nodes * saved_s / 3600 * price * expected)


__all__ = ["Inputs", "Plan", "WarmSpare", "plan", "save_times", "snapshot_time"]
