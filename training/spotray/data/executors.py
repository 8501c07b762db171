"""Where prepare's chunk tasks run: one after another in this process, or as Ray tasks on a cluster.

Both call ``fn(job, shared, report)`` for each job and hand every result to ``on_done`` as it arrives; ``on_progress``
gets the documents, tokens and input bytes of the jobs still running, summed."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

from spotray.errors import SpotrayError, StorageError

OnDone = Callable[[object, dict], None]
OnProgress = Callable[[int, int, int], None]


class InlineExecutor:
    """In this process, in order: the Python API's default, for small corpora and tests."""

    parallelism = 1

    def run(self, fn: Callable, jobs: Sequence, shared: object, on_done: OnDone, on_progress: OnProgress) -> None:
        for job in jobs:
            on_done(job, fn(job, shared, on_progress))


class RayExecutor:
    """Ray tasks of one CPU each, at most ``parallelism`` at a time (default: the cluster's CPUs), on the cluster at
    ``RAY_ADDRESS`` or on a local Ray started for the purpose (not for a single job). A task lost with its node is
    retried by Ray."""

    def __init__(self, parallelism: int | None = None, max_retries: int = 3):
        if parallelism is not None and parallelism < 1:
            raise SpotrayError(f"--parallelism must be at least 1, got {parallelism}")
        self.parallelism = parallelism
        self.max_retries = max_retries

    def run(self, fn: Callable, jobs: Sequence, shared: object, on_done: OnDone, on_progress: OnProgress) -> None:
        import ray

        if len(jobs) <= 1 and not ray.is_initialized() and not os.environ.get("RAY_ADDRESS"):
            # Nothing to spread: starting a local Ray would only add its start-up time.
            InlineExecutor().run(fn, jobs, shared, on_done, on_progress)
            return
        started = _connect()
        try:
            if self.parallelism is None:
                self.parallelism = max(1, int(ray.cluster_resources().get("CPU", 1)))
            self._run(ray, fn, list(jobs), shared, on_done, on_progress)
        finally:
            if started:
                ray.shutdown()

    def _run(self, ray, fn, queue: list, shared, on_done: OnDone, on_progress: OnProgress) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        assert self.parallelism is not None, "run() sets it"
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        # Near the driver, and restarted elsewhere if its node is lost all the same: it only feeds the progress line.
        tally = ray.remote(num_cpus=0, scheduling_strategy=here, max_restarts=-1)(_Tally).remote()
        task = ray.remote(num_cpus=1, max_retries=self.max_retries)(_run_job)
        shared_ref = ray.put(shared)
        pending: dict = {}
        try:
            while queue or pending:
                while queue and len(pending) < self.parallelism:
                    job = queue.pop(0)
                    pending[task.remote(fn, job, shared_ref, tally)] = job
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in ready:
                    on_done(pending.pop(ref), _result(ray, ref))
                running = _running_counts(ray, tally)
                numbers = {job.number for job in pending.values()}
                totals = [sum(v[i] for k, v in running.items() if k in numbers) for i in range(3)]
                on_progress(*totals)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            ray.kill(tally)


def _connect() -> bool:
    """Join the running Ray, or the cluster at RAY_ADDRESS, or start a local one; True if one was started here."""
    from spotray.ray_local import join_or_start

    return join_or_start(os.cpu_count() or 1, log_to_driver=False, logging_level=logging.WARNING)


def _run_job(fn: Callable, job, shared, tally) -> dict:
    def report(documents: int, tokens: int, bytes_in: int) -> None:
        tally.put.remote(job.number, (documents, tokens, bytes_in))

    return fn(job, shared, report)


def _running_counts(ray, tally) -> dict[int, tuple[int, int, int]]:
    """The running jobs' latest counts; none while the tally restarts (its node was lost): the jobs report again."""
    try:
        return ray.get(tally.take.remote(), timeout=10)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return {}


def _result(ray, ref) -> dict:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, SpotrayError):
            raise exc.cause from None
        raise
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError) as exc:
        raise StorageError(
            f"a prepare task was lost more times than Ray retries it ({type(exc).__name__}); run the same command "
            "again: the chunks already done are kept"
        ) from None


class _Tally:
    """Each running job's latest counts; a retried job starts again from zero, so nothing is counted twice."""

    def __init__(self):
        self.counts: dict[int, tuple[int, int, int]] = {}

    def put(self, number: int, counts: tuple[int, int, int]) -> None:
        self.counts[number] = counts

    def take(self) -> dict[int, tuple[int, int, int]]:
        return dict(self.counts)
