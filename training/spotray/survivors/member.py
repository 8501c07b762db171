"""A worker's side of the survivors: its heartbeat at the keeper, and its seat in each generation's process group."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from datetime import timedelta

import ray
import torch.distributed as dist

from spotray.errors import SpotrayError
from spotray.survivors.generations import Seat
from spotray.survivors.keeper import BEAT_S, find_keeper

log = logging.getLogger(__name__)

GROUP_TIMEOUT_S = 60.0  # a generation's process group forms, and each of its collectives ends, within this
POLL_S = 0.05
CALL_TIMEOUT_S = 10.0


class KeeperGone(SpotrayError):
    pass


class Member:
    def __init__(self, run_url: str):
        from torch.distributed import TCPStore

        self.keeper = find_keeper(run_url)
        host, port = self._call(self.keeper.start)
        self.node = ray.get_runtime_context().get_node_id()
        self.id = f"{self.node[:12]}-{os.getpid()}"
        self.store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=GROUP_TIMEOUT_S))
        self.seen = 0  # the newest generation it trained in
        self._left = threading.Event()
        beats = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=GROUP_TIMEOUT_S))
        threading.Thread(target=self._beat, args=(beats,), daemon=True, name="survivors-heartbeat").start()

    def join(self, after_failure: bool) -> Seat | str:
        """This worker's seat in the next generation, its process group formed; or what it does instead
        (``generations``: DONE, LEAVE, NOTHING_LOST)."""
        asked_at = time.monotonic()
        if dist.is_initialized():
            # A group's connections close only once nothing holds it (a cycle may, until collected); then a member
            # still inside one of its collectives fails at once instead of waiting out the group's timeout.
            dist.destroy_process_group()
            gc.collect()
        while not isinstance(answer := self._call(self.keeper.ask, self.id, self.node, self.seen, after_failure),
                             Seat) and answer == "wait":
            time.sleep(POLL_S)
        if not isinstance(answer, Seat):
            return answer
        self.seen = answer.number
        dist.init_process_group("gloo", store=dist.PrefixStore(f"generation-{answer.number}/", self.store),
                                rank=answer.rank, world_size=answer.world_size,
                                timeout=timedelta(seconds=GROUP_TIMEOUT_S))
        if answer.rank == 0:
            log.info("generation %d of the process group: %d workers, formed %.1fs after this worker asked",
                     answer.number, answer.world_size, time.monotonic() - asked_at)
        return answer

    def drain_deadline(self, rank: int) -> float | None:
        """A collective: the keeper's answer to rank 0, on every rank."""
        box = [self._call(self.keeper.drain_deadline) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def others_suffice(self) -> bool:
        return self._call(self.keeper.others_suffice)

    def newcomers_wait(self) -> bool:
        return self._call(self.keeper.newcomers_wait)

    def finish(self) -> None:
        self._call(self.keeper.finish)

    def leave(self) -> None:
        self._left.set()

    def _beat(self, store) -> None:
        key = f"beat/{self.id}"
        while not self._left.wait(BEAT_S):
            try:
                store.add(key, 1)
            except Exception:  # noqa: BLE001 - the keeper is gone: the next call says so
                return

    def _call(self, method, *args):
        try:
            return ray.get(method.remote(*args), timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            raise KeeperGone(f"the run's keeper did not answer within {CALL_TIMEOUT_S:g}s: {exc}") from exc
