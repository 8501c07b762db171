"""One training worker pod's size: its requests and limits, how many Ray Train workers it runs, and whether a node of
its GPU pool holds it."""

from __future__ import annotations

import math
from typing import NoReturn

from infra.kernel.config import TrainingJobConfig
from infra.kernel.instances import INSTANCE_SHAPES, InstanceShape
from infra.kernel.settings import key_of
from spotray.config import SnapshotSection, TrainConfig
from spotray.errors import ConfigError


def pod_resources(cpus: int, memory_gib: int, gpus: int = 0) -> dict:
    amounts = {"cpu": str(cpus), "memory": f"{memory_gib}Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def worker_resources(job: TrainingJobConfig, snapshot: SnapshotSection | None) -> dict:
    """One training worker's requests and limits (a warm spare holds the same): its memory plus the in-memory
    snapshots' bound, where snapshots are on."""
    return pod_resources(job.cpus_per_worker, job.memory_gib_per_worker + snapshot_gib(snapshot), job.gpus_per_worker)


def snapshot_gib(snapshot: SnapshotSection | None) -> int:
    """What a worker pod adds for the run's in-memory snapshots: ``snapshot.max_gb_per_node``, in whole GiB. Unset,
    it adds nothing, and the holders take at most half of the room the pod's limit leaves, read at every write."""
    if snapshot is None or not snapshot.enabled or snapshot.max_bytes is None:
        return 0
    return math.ceil(snapshot.max_bytes / (1 << 30))


def workers_per_pod(cfg: TrainConfig, job: TrainingJobConfig) -> int:
    """The Ray Train workers one worker pod runs: its GPUs over each worker's, as ``torchrun --nproc-per-node`` would
    on a multi-GPU instance (one process drives one GPU); one where the workers take no GPU."""
    gpus = cfg.scaling.worker_resources.get("GPU", 0)
    return max(1, int(job.gpus_per_worker // gpus)) if gpus else 1


def worker_pods(cfg: TrainConfig, job: TrainingJobConfig, workers: int | None = None) -> int:
    """The worker pods that hold ``workers`` (default ``scaling.num_workers``)."""
    return math.ceil((workers or cfg.scaling.num_workers) / workers_per_pod(cfg, job))


def check_pod_filled(cfg: TrainConfig, job: TrainingJobConfig) -> None:
    """Every GPU of every worker pod drives a worker: a GPU no worker takes is paid for and idle."""
    asked, held = cfg.scaling.worker_resources.get("GPU", 0), job.gpus_per_worker
    key = f"spotray:training.{key_of(TrainingJobConfig, 'gpus_per_worker')}"
    if asked and (asked > held or held % asked):
        raise ConfigError("scaling.resources_per_worker.GPU", f"each worker asks {asked:g} GPU(s), which do not "
                          f"divide a worker pod's {held} ({key})", "ask 1 GPU per worker (one process per GPU), or "
                          "give the pods a multiple of what a worker asks")
    per_pod = workers_per_pod(cfg, job)
    for name, count in (("scaling.num_workers", cfg.scaling.num_workers), ("scaling.min_workers",
                                                                           cfg.scaling.min_workers or per_pod)):
        if count % per_pod:
            raise ConfigError(name, f"{count} workers do not fill worker pods of {held} GPUs ({per_pod} workers "
                              f"each, {key}): {per_pod - count % per_pod} GPU(s) of the last would be paid and idle",
                              f"use a multiple of {per_pod}, or pods of fewer GPUs")
    if cfg.scaling.min_workers and cfg.scaling.workers_per_node != per_pod:
        raise ConfigError("scaling.workers_per_node", f"is {cfg.scaling.workers_per_node}, but the job's pods run "
                          f"{per_pod} workers each ({key}), and a lost pod takes them all",
                          f"set scaling.workers_per_node: {per_pod}, so that the global batch is checked against the "
                          "sizes the run can shrink to")
    cpus = cfg.scaling.worker_resources.get("CPU", 0) * per_pod
    if cpus > job.cpus_per_worker:
        raise ConfigError("scaling.resources_per_worker.CPU", f"{per_pod} workers of a pod ask {cpus:g} CPUs, more "
                          f"than its {job.cpus_per_worker} (spotray:training.cpusPerWorker): Ray would never place "
                          "them", "ask fewer, or raise the pods' CPUs")


def check_worker_fits(job: TrainingJobConfig, pool: str, types: tuple[str, ...], snapshot: int,
                      waiting: str = "its workers") -> None:
    """One worker pod (``snapshot``: the GiB it adds for snapshots) must fit on a node the pool launches, beside what
    the node keeps (``NODE_KEEPS_*``); otherwise the line names the first of GPUs, CPUs and memory no node meets, and
    what would be ``waiting`` for it."""
    memory = job.memory_gib_per_worker + snapshot
    if any(_holds(INSTANCE_SHAPES[name], job, memory) for name in types):
        return
    families = {name.split(".")[0] for name in types}
    holders = [name for name, shape in INSTANCE_SHAPES.items() if _holds(shape, job, memory)]
    near = [name for name in holders if name.split(".")[0] in families] or holders
    instead = f"let the pool launch {near[0]} (its family and size)" if near else "split the worker"
    shapes = {name: INSTANCE_SHAPES[name] for name in types}
    widest = max(shapes, key=lambda name: shapes[name].gpus)
    if shapes[widest].gpus < job.gpus_per_worker:
        _refuse("gpus_per_worker", waiting, f"is {job.gpus_per_worker}, but pool {pool}'s nodes have at most "
                f"{shapes[widest].gpus} GPU(s)", f"use at most {shapes[widest].gpus}, or {instead}")
    shapes = {name: shape for name, shape in shapes.items() if shape.gpus >= job.gpus_per_worker}
    roomiest = max(shapes, key=lambda name: shapes[name].pod_cpus)
    if shapes[roomiest].pod_cpus < job.cpus_per_worker:
        _refuse("cpus_per_worker", waiting, f"is {job.cpus_per_worker}, but pool {pool}'s nodes of "
                f"{job.gpus_per_worker} GPU(s) leave a pod at most {shapes[roomiest].pod_cpus} ({roomiest}: "
                f"{shapes[roomiest].vcpus} vCPUs, one kept by the node)",
                f"use at most {shapes[roomiest].pod_cpus}, or {instead}")
    shapes = {name: shape for name, shape in shapes.items() if shape.pod_cpus >= job.cpus_per_worker}
    roomiest = max(shapes, key=lambda name: shapes[name].pod_memory_gib)
    room = shapes[roomiest].pod_memory_gib
    _refuse("memory_gib_per_worker", waiting, f"is {job.memory_gib_per_worker}"
            + (f" + {snapshot} for snapshot.max_gb_per_node" if snapshot else "") + f", but pool {pool}'s nodes of "
            f"{job.gpus_per_worker} GPU(s) and {job.cpus_per_worker} CPUs leave a pod at most {room} GiB "
            f"({roomiest}: {shapes[roomiest].memory_gib} GiB, a tenth kept by the node)",
            f"ask at most {room} GiB in all" + (" (snapshot.max_gb_per_node counts)" if snapshot else "")
            + f", or {instead}")


def _holds(shape: InstanceShape, job: TrainingJobConfig, memory_gib: int) -> bool:
    return (shape.gpus >= job.gpus_per_worker and shape.pod_cpus >= job.cpus_per_worker
            and shape.pod_memory_gib >= memory_gib)


def _refuse(field: str, waiting: str, problem: str, fix: str) -> NoReturn:
    raise ConfigError(f"spotray:training.{key_of(TrainingJobConfig, field)}",
                      f"{problem}: {waiting} would wait for a node the pool never launches", fix)
