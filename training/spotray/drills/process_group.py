"""``loop.train`` on N local processes joined by a process group (gloo on CPUs, NCCL on one GPU a rank), without
Ray: the loop's guarantees checked (and benchmarked) on their own, in seconds a run."""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import queue
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from spotray.errors import TrainingFailed
from spotray.ray_local import free_port

# What every rank imports, imported once by the server its ranks fork from rather than by each rank of each run
# (3 s of CPU a rank on a 2-core machine).
PRELOADED = ("torch", "torch.distributed", "spotray.worker.loop")
RENDEZVOUS_TRIES = 2  # the port can be taken before rank 0 binds it; under load gloo's connect has failed too
log = logging.getLogger(__name__)


def train_on_process_group(config: dict, world_size: int, timeout_s: float = 600) -> dict:
    """Train the ``TrainConfig`` dict on ``world_size`` processes (GPUs where ``scaling.use_gpu``); returns rank 0's
    final metrics."""
    from spotray.config import from_dict

    return run_on_process_group(train_worker, (config,), world_size, timeout_s, from_dict(config).scaling.backend)


def train_worker(rank: int, world_size: int, config: dict) -> dict:
    import torch

    from spotray.config import from_dict
    from spotray.worker.attempt import WorkerEnv
    from spotray.worker.loop import train

    cfg = from_dict(config)
    device = torch.device("cuda", rank) if cfg.scaling.use_gpu else torch.device("cpu")
    return train(cfg, WorkerEnv(rank, world_size, device, lambda _: None))


def run_on_process_group(fn: Callable, args: tuple, world_size: int, timeout_s: float = 600, backend: str = "gloo"):
    """``fn(rank, world_size, *args)`` on every rank of a new ``backend`` group (``fn`` importable by name); rank
    0's return value. A rank's error is raised here as ``TrainingFailed`` with its last line. A group whose ranks
    could not connect, before ``fn`` ran anywhere, is started once more on a new port."""
    for tries_left in reversed(range(RENDEZVOUS_TRIES)):
        outcomes, exit_codes = _run_group(fn, args, world_size, timeout_s, backend)
        failed_to_connect = [value for kind, value in outcomes if kind == "rendezvous"]
        if not (failed_to_connect and tries_left):
            break
        log.warning("the local process group could not connect (%s); starting it again on a new port",
                    failed_to_connect[0])
    errors = [value for kind, value in outcomes if kind in ("error", "rendezvous")]
    if errors or len(outcomes) < world_size:
        raise TrainingFailed(errors[0] if errors else f"a worker exited without a result (exit codes {exit_codes})")
    return next(value for kind, value in outcomes if kind == "rank0")


def _run_group(fn: Callable, args: tuple, world_size: int, timeout_s: float,
               backend: str) -> tuple[list[tuple[str, object]], list[int | None]]:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED))  # no effect once this process's server runs
    results = context.Queue()
    port = free_port()
    here, call = _Here(dict(os.environ), list(sys.path), os.getcwd()), pickle.dumps((fn, args))
    workers = [context.Process(target=_worker, args=(here, call, rank, world_size, port, backend, results),
                               daemon=True)
               for rank in range(world_size)]
    for worker in workers:
        worker.start()
    outcomes = _collect(results, workers, time.monotonic() + timeout_s)
    for worker in workers:
        worker.join(5)
        if worker.is_alive():
            worker.kill()
    return outcomes, [w.exitcode for w in workers]


def _collect(results, workers: list, deadline: float) -> list[tuple[str, object]]:
    """Every rank's outcome, read as it comes (a rank blocks on a full pipe until its result is read), until all
    have reported, one could not connect (the others would wait for it), one died without a word, or the deadline
    passed."""
    outcomes: list[tuple[str, object]] = []
    while len(outcomes) < len(workers) and time.monotonic() < deadline:
        try:
            outcomes.append(results.get(timeout=1))
        except queue.Empty:
            if sum(w.exitcode is not None for w in workers) > len(outcomes):
                break
        else:
            if outcomes[-1][0] == "rendezvous":
                break
    return outcomes


@dataclass(frozen=True)
class _Here:
    """The caller's environment, import path and directory now, which a spawned rank would start with: a forked one
    starts with its server's, from when the server started."""

    environ: dict[str, str]
    path: list[str]
    cwd: str

    def enter(self) -> None:
        os.environ.clear()
        os.environ.update(self.environ)
        sys.path[:] = self.path
        os.chdir(self.cwd)


def _worker(here: _Here, call: bytes, rank: int, world_size: int, port: int, backend: str, results) -> None:
    here.enter()
    fn, args = pickle.loads(call)  # on the caller's import path
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # the ranks share the machine's cores
    try:
        device = torch.device("cuda", rank) if backend == "nccl" else None
        if device is not None:
            torch.cuda.set_device(device)
        try:
            dist.init_process_group(backend, rank=rank, world_size=world_size, device_id=device)
            dist.barrier()  # every rank connected: ``fn`` runs nowhere on a group started again
        except RuntimeError:
            results.put(("rendezvous", f"rank {rank}: {traceback.format_exc().strip().splitlines()[-1]}"))
            return
        value = fn(rank, world_size, *args)
        dist.destroy_process_group()
        results.put(("rank0" if rank == 0 else "done", value))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        results.put(("error", f"rank {rank}: {traceback.format_exc().strip().splitlines()[-1]}"))
