"""What travels to the Ray workers besides the config: forwarded environment variables and the working dir."""

from __future__ import annotations

import fnmatch
import logging
import os
from pathlib import Path

from training.config import EnvSection, TrainConfig
from training.errors import ConfigError

log = logging.getLogger(__name__)

# Storage credentials always travel, so that a cluster started elsewhere reaches the same object store.
STORAGE_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
               "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")

# Never packaged: core dumps, checkpoints and runs, virtualenvs, data, caches, VCS metadata.
WORKING_DIR_EXCLUDES = ("core", "core.*", "*.core", "spotray-runs", "checkpoints", "*.distcp", ".venv", "venv",
                        "data", "*.bin", "*.pt", "*.safetensors", "__pycache__", ".pytest_cache", ".ruff_cache",
                        ".git", "*.egg-info")


def worker_runtime_env(cfg: TrainConfig) -> dict:
    """The runtime_env of every Ray Train worker."""
    env_vars = {} if cfg.env.on_nodes else forwarded_env(cfg.env)
    runtime_env = {"env_vars": env_vars} if env_vars else {}
    if cfg.runtime.working_dir:
        runtime_env.update(check_working_dir(cfg.runtime.working_dir, cfg.runtime.max_package_mb))
    return runtime_env


def forwarded_env(env: EnvSection, environ: dict | None = None) -> dict[str, str]:
    """Variables copied from the driver to every worker. Names are logged, values never."""
    environ = os.environ if environ is None else environ
    names = [*STORAGE_ENV, *env.forward]
    missing = [n for n in env.forward if n not in environ]
    if missing:
        log.warning("env.forward: not set on the driver, so not forwarded: %s", ", ".join(missing))
    return {n: environ[n] for n in names if n in environ}


def packaged_files(working_dir: Path) -> list[tuple[Path, int]]:
    """(path, size) of every file Ray would upload from ``working_dir``, after the excludes."""
    files = []
    for root, dirs, names in os.walk(working_dir):
        dirs[:] = [d for d in dirs if not _excluded(d)]
        for name in names:
            path = Path(root, name)
            if not _excluded(name) and path.is_file() and not path.is_symlink():
                files.append((path, path.stat().st_size))
    return files


def check_working_dir(working_dir: str, limit_mb: int) -> dict:
    """Refuse, before submitting, a working dir whose package would exceed ``limit_mb``."""
    root = Path(working_dir)
    if not root.is_dir():
        raise ConfigError("runtime.working_dir", f"{working_dir} is not a directory")
    files = packaged_files(root)
    total = sum(size for _, size in files)
    if total > limit_mb * 2**20:
        biggest = sorted(files, key=lambda f: f[1], reverse=True)[:5]
        listing = ", ".join(f"{p.relative_to(root)} ({s / 2**20:.1f} MiB)" for p, s in biggest)
        raise ConfigError("runtime.working_dir",
                          f"{working_dir} packs to {total / 2**20:.1f} MiB, over the {limit_mb} MiB limit; "
                          f"biggest files: {listing}",
                          "move data and checkpoints to storage URLs, or raise runtime.max_package_mb")
    return {"working_dir": str(root.resolve()), "excludes": list(WORKING_DIR_EXCLUDES)}


def _excluded(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in WORKING_DIR_EXCLUDES)
