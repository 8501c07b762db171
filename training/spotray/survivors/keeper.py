"""The keeper: one actor per run, on the driver's node, that the workers meet at. It holds the ``TCPStore`` each
generation's process group forms in, watches every worker's heartbeat there, reads Ray's drain table (Ray Train's
preemption watcher is off for a backend with replica groups), and seats the workers by ``generations``' rule.

Every method answers at once: the workers poll, so a worker never waits on a call that cannot end."""

from __future__ import annotations

import asyncio
import hashlib
import time
from datetime import timedelta

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from spotray.ray_nodes import drain_deadline
from spotray.snapshots.holders import NAMESPACE
from spotray.survivors.generations import Generations, Seat

STALE_S = 1.5  # a worker whose heartbeat has not moved for this long is lost
BEAT_S = 0.1  # a worker's heartbeat
READ_S = 0.05  # the keeper reads the heartbeats
DRAIN_READ_S = 1.0
DRAIN_READ_TIMEOUT_S = 5.0


def keeper_name(run_url: str) -> str:
    return f"keeper-{hashlib.sha1(run_url.encode()).hexdigest()[:12]}"


@ray.remote(num_cpus=0)
class Keeper:
    def __init__(self, num_workers: int, min_workers: int):
        from torch.distributed import TCPStore

        self.host = ray.util.get_node_ip_address()
        self.store = TCPStore(self.host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
        self.rule = Generations(num_workers, min_workers, nothing_lost_s=2 * STALE_S)
        self.nodes: dict[str, str] = {}  # the workers it watches -> their node's id
        self.beats: dict[str, tuple[int, float]] = {}  # worker -> (its count, when that last moved)
        self.drains: dict[str, int] = {}  # draining node -> its deadline as Ray gives it (ms, 0: none given)
        self.finished_at: float | None = None
        self.controller = None
        self.watches: list[asyncio.Task] = []

    async def start(self) -> tuple[str, int]:
        """Starts the watches; where the store listens."""
        if not self.watches:
            self.watches = [asyncio.create_task(self._watch_beats()), asyncio.create_task(self._watch_drains())]
        return self.host, self.store.port

    async def ask(self, member: str, node: str, seen: int, after_failure: bool) -> Seat | str:
        if member not in self.nodes:
            self.nodes[member] = node
            self.beats[member] = (int(self.store.add(_beat_key(member), 0)), time.monotonic())
        if node in self.drains:
            self.rule.leave(member)
        return self.rule.ask(member, seen, after_failure, time.monotonic())

    async def drain_deadline(self) -> float | None:
        """The earliest deadline of a draining node that holds a member of the current generation."""
        nodes = {self.nodes.get(m) for m in self.rule.ranks}
        deadlines = [drain_deadline(self.drains[n]) for n in nodes if n in self.drains]
        return min(deadlines) if deadlines else None

    async def others_suffice(self) -> bool:
        return self.rule.others_suffice()

    async def newcomers_wait(self) -> bool:
        return self.rule.newcomers_wait()

    async def finish(self) -> None:
        self.rule.finished = True
        self.finished_at = time.monotonic()

    async def ended_for_s(self) -> float | None:
        return None if self.finished_at is None else time.monotonic() - self.finished_at

    async def set_controller(self, controller) -> None:
        self.controller = controller

    async def get_controller(self):
        return self.controller

    async def _watch_beats(self) -> None:
        while True:
            now = time.monotonic()
            for member in list(self.nodes):
                count = int(self.store.add(_beat_key(member), 0))
                last = self.beats[member]
                if count != last[0]:
                    self.beats[member] = (count, now)
                elif now - last[1] > STALE_S:
                    self.rule.lose(member)
                    del self.nodes[member], self.beats[member]
            await asyncio.sleep(READ_S)

    async def _watch_drains(self) -> None:
        reading: asyncio.Future | None = None
        while True:
            if reading is None or reading.done():
                reading = asyncio.ensure_future(asyncio.to_thread(_draining_nodes))
            try:  # a GCS that stalls must not stall the keeper: the read goes on in its thread
                self.drains = await asyncio.wait_for(asyncio.shield(reading), DRAIN_READ_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the last table stands until one reads
                pass
            for member, node in self.nodes.items():
                if node in self.drains:
                    self.rule.leave(member)
            await asyncio.sleep(DRAIN_READ_S)


def _beat_key(member: str) -> str:
    return f"beat/{member}"


def _draining_nodes() -> dict[str, int]:
    from ray._private.state import state  # Ray's drain table: what its own preemption watcher reads

    return state.get_draining_nodes()


def start_keeper(run_url: str, num_workers: int, min_workers: int) -> ray.actor.ActorHandle:
    """The run's keeper, started on this node, and ended once its caller drops the handle (Ray collects a named
    actor that nothing holds) or with the driver: no call at the end, which the head may not answer. A keeper an
    earlier fit left is ended first."""
    stop_keeper(run_url)
    keeper = Keeper.options(  # type: ignore[attr-defined]  # ray.remote's class gains .options
        name=keeper_name(run_url), namespace=NAMESPACE,
        scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
    ).remote(num_workers, min_workers)
    ray.get(keeper.start.remote())
    return keeper


def find_keeper(run_url: str) -> ray.actor.ActorHandle:
    return ray.get_actor(keeper_name(run_url), namespace=NAMESPACE)


def stop_keeper(run_url: str) -> None:
    try:
        ray.kill(find_keeper(run_url))
    except ValueError:  # none runs
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            find_keeper(run_url)
        except ValueError:
            return
        time.sleep(0.1)
