"""What a run's config must say before it runs as a RayJob: each pod reaches only the image, the object store and
its own short-lived disk, and its workers hold GPUs. A config tried on a laptop (``./runs``, no GPU) would otherwise
start GPU nodes to write checkpoints that vanish with each pod, or train on CPU beside idle GPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster.worker_size import check_pod_filled, check_worker_fits, snapshot_gib, worker_pods, workers_per_pod
from spotray.config import TrainConfig
from spotray.errors import ConfigError

if TYPE_CHECKING:
    from cluster.rayjob import JobSettings


def check_for_cluster(cfg: TrainConfig, settings: JobSettings) -> None:
    _check_gpus(cfg, settings, snapshot_gib(cfg.snapshot))
    if cfg.runtime.working_dir and not cfg.runtime.working_dir_is_uri:
        raise ConfigError("runtime.working_dir", f"{cfg.runtime.working_dir} is a directory of this machine, which a "
                          "RayJob's cluster cannot read",
                          "bake the code into the training image (COPY it in training/Dockerfile, `make image`), or "
                          "give the URI of a zip of it in storage (s3://bucket/code.zip)")
    for key, url in (("checkpoint.path", cfg.checkpoint.path), ("audit_dir", cfg.audit_dir)):
        if url is not None:
            _check_writable(key, url, settings.storage_roots)
    hf = cfg.model.hf
    reads = {"data.path": cfg.data.path, "data.val_path": cfg.data.val_path,
             "model.hf.pretrained": hf.pretrained if hf else None,
             "model.hf.config": hf.config if hf and isinstance(hf.config, str) else None}
    for key, url in reads.items():
        if url is not None and "://" not in url and not url.startswith("/"):
            raise ConfigError(key, f"{url} is a path of this machine, which the job's pods cannot read",
                              f"give its s3:// URL (upload it under {_example_root(settings.storage_roots)}), or an "
                              "absolute path inside the training image")


def _check_gpus(cfg: TrainConfig, settings: JobSettings, snapshot: int) -> None:
    job, pool, per_pod, limit = settings.job, settings.gpu_pool, settings.job.gpus_per_worker, settings.pool_gpu_limit
    if not cfg.scaling.use_gpu:
        raise ConfigError("scaling.use_gpu", f"is false, but the job's workers run on GPU pool {pool} with "
                          f"{per_pod} GPU(s) each, which would stay idle", "set scaling.use_gpu: true")
    if settings.pool_instance_types:
        check_worker_fits(job, pool, settings.pool_instance_types, snapshot)
    check_pod_filled(cfg, job)
    fewest, workers = cfg.scaling.min_workers or cfg.scaling.num_workers, workers_per_pod(cfg, job)
    gpus = worker_pods(cfg, job, fewest) * per_pod
    if limit is not None and gpus > limit:
        key = "scaling.min_workers" if cfg.scaling.min_workers else "scaling.num_workers"
        fits = limit // per_pod * workers
        shape = f"of {per_pod} GPU(s)" if workers == 1 else f"({workers} to a pod of {per_pod} GPUs)"
        raise ConfigError(key, f"{fewest} workers {shape} need {gpus} GPUs, over pool {pool}'s gpuLimit {limit}: the "
                          "job would wait for nodes the pool never launches",
                          (f"train on at most {fits} workers, or " if fits else "")
                          + f"raise the pool's gpuLimit to {gpus}")


def _check_writable(key: str, url: str, roots: tuple[str, ...]) -> None:
    if not url.startswith("s3://"):
        raise ConfigError(key, f"{url} is on each pod's own disk, lost with the pod at a preemption (everything "
                          "written there with it)", f"give a URL in the object store, e.g. {_example_root(roots)}")
    if roots and not any(f"{url.rstrip('/')}/".startswith(root) for root in roots):
        raise ConfigError(key, f"{url} is outside the stack's storage, {' or '.join(roots)}, the only place its "
                          "training pods may write", f"put it under {roots[0]}")


def _example_root(roots: tuple[str, ...]) -> str:
    return roots[0] if roots else "s3://<bucket>/<prefix>/"
