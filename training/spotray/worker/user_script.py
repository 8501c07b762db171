"""``spotray train --script``: a user's own training script run on every Ray Train worker, with a session
(``spotray.restore`` ... ``should_stop``) and ``torch.distributed`` already set up as ``torchrun`` would, where the
script's own ``init_process_group`` joins that group and its ``destroy_process_group`` leaves it to the session.

The attempt ends when the script returns (the run is complete), when it moved on a notice (``session.MovedOn``
raised into it, or ``spotray.should_stop()`` seen), or when it raises: then the one line
``rank N: ExceptionType: message`` reaches the console, the traceback only the log."""

from __future__ import annotations

import dataclasses
import logging
import os
import runpy
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from spotray.checkpoints.dcp import checkpoints_root, list_committed
from spotray.config import TrainConfig
from spotray.errors import ConfigError, SpotrayError, TrainingFailed
from spotray.storage import Location
from spotray.worker import session as sessions
from spotray.worker.attempt import WorkerEnv
from spotray.worker.telemetry import lost_peer

log = logging.getLogger(__name__)

class ScriptFailed(TrainingFailed):
    """The user's script raised: ``rank N: ExceptionType: message``; exit 2 (the script's own error)."""

    exit_code = 2


def preflight(cfg: TrainConfig, run_root: Location) -> None:
    """On the driver, before any worker starts: the script is there and compiles, and the run's checkpoints are
    a script's saved at this world size (or ``script.allow_world_size_change``)."""
    path = script_file(cfg)
    if cfg.runtime.working_dir_is_uri:
        return  # the script is inside the package, which the workers fetch
    if not path.is_file():
        raise ConfigError("--script", f"{path} is not a file", "give the training script's path")
    try:
        compile(path.read_bytes(), str(path), "exec")
    except SyntaxError as exc:
        raise ConfigError("--script", f"{path} line {exc.lineno}: SyntaxError: {exc.msg}") from None
    committed = list_committed(checkpoints_root(run_root), warn=False)
    if committed and not committed[0].is_files:
        raise ConfigError("run.name", f"{run_root.url} holds checkpoints of spotray's own loop, not of a script",
                          "give the script run a new run.name")
    if committed:
        sessions.check_world_size(cfg, committed[0].world_size, cfg.scaling.num_workers)


def with_script(cfg: TrainConfig, path: str) -> TrainConfig:
    """``--script FILE``: the file's folder is the working dir shipped to the workers, unless runtime.working_dir
    is set; then the file must be inside it. ``script.path`` is the file relative to that folder."""
    file = Path(path).resolve()
    if not cfg.runtime.working_dir:
        runtime = dataclasses.replace(cfg.runtime, working_dir=str(file.parent))
        return dataclasses.replace(cfg, runtime=runtime, script=dataclasses.replace(cfg.script, path=file.name))
    if cfg.runtime.working_dir_is_uri:
        return cfg  # the script is a path inside the package
    base = Path(cfg.runtime.working_dir).resolve()
    if not file.is_relative_to(base):
        raise ConfigError("--script", f"{path} is outside runtime.working_dir={cfg.runtime.working_dir}, which is "
                          "what the workers get", "move the script into it, or leave runtime.working_dir out")
    return dataclasses.replace(cfg, script=dataclasses.replace(cfg.script, path=file.relative_to(base).as_posix()))


def script_file(cfg: TrainConfig) -> Path:
    """The script on the driver: relative to runtime.working_dir, which travels to the workers."""
    assert cfg.script.path is not None  # a script run's
    base = cfg.runtime.working_dir if cfg.runtime.working_dir and not cfg.runtime.working_dir_is_uri else "."
    return Path(base, cfg.script.path)


def run_on_worker(cfg: TrainConfig, env: WorkerEnv) -> None:
    """Runs the script as ``__main__`` with ``script.args``, inside a session. Ray's worker has the shipped
    working dir as its current directory, and torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE ...) set."""
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)
    else:  # a plain Accelerator() then joins the process group instead of training alone on each CPU worker
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    session = sessions.Session(cfg, env)
    sessions.begin(session)
    argv, path = sys.argv, cfg.script.path
    assert path is not None  # a script run's
    sys.argv = [path, *cfg.script.args]
    sys.path.insert(0, str(Path(path).resolve().parent))
    try:
        with _group_made_for_the_script():
            runpy.run_path(path, run_name="__main__")
    except sessions.MovedOn:
        session.finish(moved=True)
        return
    except sessions.FinishedAlready as done:
        session.finish(moved=False, final=done.final)
        return
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _failed(session, env, exc, f"the script exited with status {exc.code}")
    except SpotrayError as exc:  # spotray's own one-line errors (a world-size change, a full disk)
        _failed(session, env, exc, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - the script's error, in one line; the traceback goes to the log
        if lost_peer(exc):  # another rank's node vanished: Ray's restart, not the script's error
            session.failed(exc)
            raise
        _failed(session, env, exc, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        sys.argv = argv
        sessions.begin(None)
    session.finish(moved=session.should_stop())


@contextmanager
def _group_made_for_the_script() -> Iterator[None]:
    """A script written for torchrun makes the default process group and destroys it at its end; Ray Train has made
    it here, and the session still needs it after the script, so both calls leave it as it is (torch offers no hook
    for this; only the two names are replaced, for the script's run)."""
    init, destroy = dist.init_process_group, dist.destroy_process_group

    def join(*args, **kwargs) -> None:
        if not dist.is_initialized():
            return init(*args, **kwargs)
        log.info("the script's init_process_group joins the process group Ray Train made (%s, %d ranks)",
                 dist.get_backend(), dist.get_world_size())
        return None

    def leave(group=None) -> None:
        if group is not None and group is not dist.group.WORLD:
            destroy(group)

    dist.init_process_group, dist.destroy_process_group = join, leave
    try:
        yield
    finally:
        dist.init_process_group, dist.destroy_process_group = init, destroy


def _failed(session: sessions.Session, env: WorkerEnv, exc: BaseException, line: str) -> None:
    log.info("rank %d: the script failed", env.rank, exc_info=exc)  # the traceback: in the log, not the console
    if session.cfg.script.debug:
        from ray.util import debugpy

        debugpy._post_mortem()  # Ray's post-mortem: waits for the Ray Distributed Debugger to attach
    session.failed(exc)
    raise ScriptFailed(f"rank {env.rank}: {line}") from None

