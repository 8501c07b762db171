"""spotray's pods under the restricted Pod Security profile: non-root with the training image's own user, no
privilege escalation, no capabilities, the runtime's default seccomp profile and a read-only root filesystem, with
volumes for what must be written: ``/tmp`` (Ray's session dir and the unpacked working dir), ``/dev/shm`` (Ray's
object store and NCCL, counted against the pod's memory) and one cache folder the libraries' cache variables point
into (Hugging Face, Triton, inductor, matplotlib, XDG)."""

from __future__ import annotations

RUN_AS_UID = 1000  # the `ray` user of the rayproject/ray images training/Dockerfile builds on
RUN_AS_GID = 100  # its group, `users`
CACHE_DIR = "/cache"
TMP_GIB = 16  # Ray's session logs and a shipped working dir (runtime.max_package_mb) unpacked
CACHE_GIB = 20  # downloaded tokenizers and configs, compiled kernels
SHM_SHARE = 0.3  # of the pod's memory for /dev/shm: Ray's object store default share
CACHE_VARIABLES = {"XDG_CACHE_HOME": CACHE_DIR, "XDG_CONFIG_HOME": f"{CACHE_DIR}/config",
                   "HF_HOME": f"{CACHE_DIR}/huggingface", "TRITON_CACHE_DIR": f"{CACHE_DIR}/triton",
                   "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_DIR}/inductor", "MPLCONFIGDIR": f"{CACHE_DIR}/matplotlib"}


def pod_context() -> dict:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_UID, "runAsGroup": RUN_AS_GID, "fsGroup": RUN_AS_GID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_context() -> dict:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True}


def writable_volumes(memory_gib: int | None) -> list[dict]:
    """``/tmp`` and the cache on the node's disk; ``/dev/shm`` in memory where the pod runs Ray (``memory_gib``)."""
    volumes = [{"name": "tmp", "emptyDir": {"sizeLimit": f"{TMP_GIB}Gi"}},
               {"name": "cache", "emptyDir": {"sizeLimit": f"{CACHE_GIB}Gi"}}]
    if memory_gib:
        shm_mib = int(memory_gib * 1024 * SHM_SHARE)
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_mib}Mi"}})
    return volumes


def writable_mounts(ray: bool) -> list[dict]:
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "cache", "mountPath": CACHE_DIR}]
    return [*mounts, {"name": "shm", "mountPath": "/dev/shm"}] if ray else mounts


def cache_env() -> list[dict]:
    return [{"name": name, "value": value} for name, value in CACHE_VARIABLES.items()]
