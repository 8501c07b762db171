"""What travels to the Ray workers besides the config: forwarded environment variables and the working dir.

The working dir travels as a zip in the run's storage, named by its content, and each worker unpacks it itself
through the storage module (once per node and content) before anything imports it: a URI in the run's storage
reaches every node that can reach the run's checkpoints, with the run's storage settings (endpoint, credentials);
every worker of every attempt gets the same code, and a changed directory gets a new package. Ray's own
``working_dir`` would fetch it in the node's runtime-env agent, with boto3's defaults, before the worker process
may start, and a runtime_env keeps Ray from reusing its started worker processes; it is used only for a package
of a scheme the storage module does not read (``https://``, ``gs://``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import io
import logging
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

from spotray.config import EnvSection, TrainConfig
from spotray.errors import ConfigError
from spotray.storage import Location, resolve

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


def worker_runtime_env(cfg: TrainConfig) -> dict:
    """The runtime_env of every Ray Train worker: forwarded variables, and a package only Ray can fetch."""
    env_vars = {} if cfg.env.on_nodes else forwarded_env(cfg.env)
    runtime_env: dict[str, dict[str, str] | str] = {"env_vars": env_vars} if env_vars else {}
    working_dir = cfg.runtime.working_dir
    if working_dir is not None and cfg.runtime.working_dir_is_uri and not _fetched_by_spotray(working_dir):
        runtime_env["working_dir"] = working_dir
    return runtime_env


def shipped(cfg: TrainConfig, run_root: Location) -> TrainConfig:
    """``cfg`` as the workers get it: a local working dir packaged into ``run_root`` and named by its URI."""
    if not cfg.runtime.working_dir or cfg.runtime.working_dir_is_uri:
        return cfg
    url = ship_working_dir(cfg.runtime.working_dir, cfg.runtime.max_package_mb, run_root.child(CODE_DIR))
    return dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, working_dir=url))


def enter_working_dir(cfg: TrainConfig, cache: Path | None = None) -> None:
    """On a worker, before the task or script imports: the package unpacked on this node, as the current
    directory and first on the import path (where Ray is not the one fetching it)."""
    url = cfg.runtime.working_dir
    if not url or not _fetched_by_spotray(url):
        return
    directory = unpack(resolve(url, cfg.storage.options()), cache or Path(tempfile.gettempdir(), "spotray", "code"))
    os.chdir(directory)
    sys.path.insert(0, str(directory))


def _fetched_by_spotray(url: str) -> bool:
    return url.startswith(("s3://", "file://"))


def unpack(package: Location, cache: Path) -> Path:
    """The package's files in ``cache``, fetched once per node: workers of the node that find the folder take it.
    Its name is the package's URL, size and time, so that a zip replaced under the same URL is fetched again."""
    key = hashlib.sha256(f"{package.url}|{package.stamp()}".encode()).hexdigest()[:20]
    target = cache / key
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=cache, prefix=".unpack-"))
    try:
        with zipfile.ZipFile(io.BytesIO(package.read_bytes())) as archive:
            _extract(archive, scratch / "files")
        try:
            os.rename(scratch / "files", target)
        except OSError:  # another worker of this node unpacked it first
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _extract(archive: zipfile.ZipFile, into: Path) -> None:
    """All entries, without their one top-level directory where they share one (as Ray unpacks a zip), and with
    the file modes they were packed with."""
    entries = [e for e in archive.infolist() if not e.is_dir()]
    tops = {e.filename.split("/", 1)[0] for e in entries}
    strip = len(tops) == 1 and all("/" in e.filename for e in entries)
    for entry in entries:
        name = entry.filename.split("/", 1)[1] if strip else entry.filename
        path = into / name
        if not path.resolve().is_relative_to(into.resolve()):
            raise ConfigError("runtime.working_dir", f"the package holds {entry.filename}, outside its folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(archive.read(entry))
        mode = entry.external_attr >> 16 & 0o777
        if mode:
            path.chmod(mode)


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


def forwarded_env(env: EnvSection, environ: Mapping[str, str] | None = None) -> dict[str, str]:
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
