"""What travels to the Ray workers besides the config: forwarded environment variables and the working dir.

The working dir travels as a zip in the run's storage, named by its content, whose URI Ray Train's workers fetch:
Ray takes a local directory only in a job-level runtime_env (``ray.init``), which spotray does not own where Ray
is started by someone else; a URI in the run's storage reaches every node that can reach the run's checkpoints,
every worker of every attempt gets the same code, and a changed directory gets a new package.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import tempfile
import zipfile
from pathlib import Path

from spotray.config import EnvSection, TrainConfig
from spotray.errors import ConfigError
from spotray.storage import Location

log = logging.getLogger(__name__)

# Storage credentials always travel, so that a cluster started elsewhere reaches the same object store.
STORAGE_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
               "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")

# Never packaged: core dumps, checkpoints and runs, virtualenvs, caches, VCS metadata. Large files (data, weights)
# are caught by size: runtime.max_package_mb refuses the package, naming its biggest files.
WORKING_DIR_EXCLUDES = ("core", "core.*", "*.core", "spotray-runs", "checkpoints", "*.distcp", ".venv", "venv",
                        "__pycache__", ".pytest_cache", ".ruff_cache", ".git", ".hg", ".svn", "*.egg-info")
CODE_DIR = "code"  # <checkpoint.path>/<run.name>/code/<content hash>.zip
_PACKAGE_TOP = "working_dir"  # the one top-level directory Ray strips when it unpacks a zip from a URI
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed, so that the same files make the same bytes and the same name


def worker_runtime_env(cfg: TrainConfig, run_root: Location) -> dict:
    """The runtime_env of every Ray Train worker; a local working dir is packaged into ``run_root`` first."""
    env_vars = {} if cfg.env.on_nodes else forwarded_env(cfg.env)
    runtime_env = {"env_vars": env_vars} if env_vars else {}
    if cfg.runtime.working_dir_is_uri:
        runtime_env["working_dir"] = cfg.runtime.working_dir
    elif cfg.runtime.working_dir:
        runtime_env["working_dir"] = ship_working_dir(cfg.runtime.working_dir, cfg.runtime.max_package_mb,
                                                      run_root.child(CODE_DIR))
    return runtime_env


def ship_working_dir(working_dir: str, limit_mb: int, code_root: Location) -> str:
    """The URI every worker fetches the local ``working_dir`` from: its package in ``code_root``, written once per
    content."""
    root = Path(working_dir)
    files = check_working_dir(working_dir, limit_mb)
    with tempfile.TemporaryDirectory(prefix="spotray-code-") as scratch:
        package = Path(scratch, "package.zip")
        digest = _zip(root, files, package)
        target = code_root.child(f"{digest[:20]}.zip")
        if not target.exists():
            target.put_file(str(package))
    log.info("runtime.working_dir %s: %d files, shipped as %s", working_dir, len(files), target.url)
    return target.url if target.is_s3 else f"file://{target.path}"


def _zip(root: Path, files: list[tuple[Path, int]], package: Path) -> str:
    """Writes ``files`` under one top-level directory; returns the SHA-256 of the package."""
    with zipfile.ZipFile(package, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, _ in sorted(files):
            entry = zipfile.ZipInfo(f"{_PACKAGE_TOP}/{path.relative_to(root).as_posix()}", date_time=_ZIP_TIME)
            entry.external_attr = (path.stat().st_mode & 0o777) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, path.read_bytes())
    with open(package, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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


def check_working_dir(working_dir: str, limit_mb: int) -> list[tuple[Path, int]]:
    """The files of the working dir's package; refuses, before anything starts, one over ``limit_mb``."""
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
    return files


def _excluded(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in WORKING_DIR_EXCLUDES)
