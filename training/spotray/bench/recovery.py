"""``spotray bench recovery``: seconds from a replacement node joining to the first resumed training step, for
spotray and for plain Ray Train with a rank-0 ``torch.save`` checkpoint, on the same kill drill and model.
``--fault notice``: spotray alone, seconds from the fault to the first resumed step after a preemption notice
against after a kill, the replacement node starting at the fault in both (as in ``spotray demo``). ``--fault both``:
the two on one cluster, spotray's run taking its notice and kill after the kill compared with the baseline's.
``--fault shrink``: spotray alone, a kill timed from the fault, the replacement starting at once, with
``scaling.min_workers=1`` and in-memory snapshots (the run goes on with the survivor) against neither (it waits for
the replacement, as it did before issue 44).

Each fault: once a checkpoint later than where the run last resumed exists, a worker node of a head plus 2 worker
nodes (the cluster the previous drill left whole, or a new one) gets a notice or is SIGKILLed; for the kills compared
with the baseline, after a pause (Ray has noticed and waits for capacity) a replacement node starts, and the clock
runs from its start until a resumed step ends, as each job records it: nothing polls storage or the cluster while
the clock runs. One run takes its faults one after another: each once the run has resumed from the one before.
Checkpoints go to each storage asked for: a local dir (shared by the local "nodes", which real nodes never are)
and S3 (a moto server on loopback), where spot training keeps them."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from spotray import config
from spotray.accounts import goodput, ledger
from spotray.bench.common import bench_corpus, machine, scratch_dir
from spotray.checkpoints.dcp import checkpoints_root, list_committed
from spotray.drills.cluster import LocalCluster, ReusedCluster, given_or_own
from spotray.drills.s3local import create_bucket, moto_server
from spotray.errors import SpotrayError
from spotray.storage import Location
from spotray.worker.attempt import run_root

CAPACITY_GAP_S = 10.0  # how long the cluster stays a node short before the replacement joins
SETTLE_S = 1.0  # after the checkpoint a fault waits for, so that Ray has registered the baseline's too


def _config(data_url: str, ckpt_url: str, endpoint: str | None, name: str, preset: str, every: int,
            faults: int) -> config.TrainConfig:
    """Steps enough for every fault to land before the run ends: each lands within about two checkpoint intervals of
    the step the run last resumed from (a checkpoint after it, seen up to a driver's poll late). Without in-memory
    snapshots: every compared restart reads a checkpoint, as the baseline's does."""
    return config.load(None, [
        f"data.path={data_url}", f"checkpoint.path={ckpt_url}", f"run.name={name}", f"model.preset={preset}",
        "train.seq_len=128", "train.global_batch_size=8", f"train.max_steps={(2 * faults + 1) * every}",
        "train.log_every=1", f"checkpoint.every_steps={every}", "checkpoint.keep_last=2", "scaling.num_workers=2",
        "snapshot.every_steps=0",
        "env.on_nodes=true",  # the nodes inherit the storage credentials, as the RayJob's pods get them
        *([f"storage.endpoint_url={endpoint}"] if endpoint else []),
    ])


@dataclass(frozen=True)
class Resumed:
    """A resumed attempt as a job reports it (UNIX times)."""

    from_step: int
    entered_at: float  # the train function started on the new worker group
    first_step_at: float  # its first step ended
    phases: dict[str, float] = field(default_factory=dict)  # seconds of named parts of the in-worker time


@dataclass(frozen=True)
class Fault:
    kind: str  # "notice" or "kill"
    gap_s: float  # how long the cluster stays a node short before the replacement starts


FROM_THE_FAULT = (Fault("notice", 0.0), Fault("kill", 0.0))  # a replacement at once: timed from the fault
_RESUMED_LINE = re.compile(r"^spotray: (?:RESUMED|SHRUNK to \d+ workers?) from step (\d+)", re.MULTILINE)


@dataclass(frozen=True)
class Job:
    """A job on the cluster, as the fault loop (``interrupt``) reads it: from what the job writes on this machine, so
    that nothing polls storage or the cluster while a clock runs."""

    proc: subprocess.Popen
    checkpointed_after: Callable[[int], bool]  # a checkpoint of a later step is committed
    resumed_from: Callable[[int], int | None]  # where restart n resumed, once its first step ended
    resumed: Callable[[int], Resumed | None]  # restart n in full, read once the job ended


def _spotray_job(cfg: config.TrainConfig, cluster: LocalCluster, log: Path) -> Job:
    config_file = log.with_suffix(".yaml")
    config_file.write_text(yaml.safe_dump(cfg.to_dict()))
    return spotray_job(["--config", str(config_file)], run_root(cfg), ("startup", "restore"), cluster, log)


def spotray_job(train_args: list[str], root: Location, phases: tuple[str, ...], cluster: LocalCluster, log: Path,
                cwd: Path | None = None) -> Job:
    """``spotray train *train_args`` on the cluster, of the run at ``root``; ``phases``: the seconds of the ledger's
    phases that each restart reports."""
    proc = subprocess.Popen([sys.executable, "-m", "spotray.cli", "train", *train_args], cwd=cwd,
                            env={**cluster.node_env(), "RAY_ADDRESS": cluster.address}, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)

    def checkpointed_after(step: int) -> bool:
        newest = list_committed(checkpoints_root(root), warn=False)[:1]
        return bool(newest) and newest[0].step > step

    def resumed_from(restart: int) -> int | None:
        steps = _RESUMED_LINE.findall(log.read_text())  # the driver's console
        return int(steps[restart - 1]) if len(steps) >= restart else None

    return Job(proc, checkpointed_after, resumed_from,
               lambda restart: _spotray_resumed(ledger.attempts_root(root), phases, restart))


def _spotray_resumed(attempts: Location, phases: tuple[str, ...], restart: int) -> Resumed | None:
    """Restart ``restart`` of a spotray run (the attempt after its ``restart``-th interruption) as its ledger records
    it, once its first step has ended."""
    found = ledger.read_attempts(attempts)
    if len(found) <= restart:
        return None
    status = goodput.read_status(attempts, found[restart].attempt_id)
    if status is None or not status.get("first_step_at"):
        return None
    return Resumed(found[restart].from_step, status["entered_at"], status["first_step_at"],
                   {phase: status[f"{phase}_s"] for phase in phases})


def baseline_job(module: str, job: dict, cluster: LocalCluster, log: Path, phases: tuple[str, ...] = ()) -> Job:
    """``python -m module JOB`` on the cluster, read from the progress file it keeps (``progress_file(log)``): the
    newest committed step and each attempt's (resumed-from step, train function entered, first step ended, then
    ``phases``' seconds)."""
    progress = progress_file(log)
    proc = subprocess.Popen([sys.executable, "-m", module, json.dumps({**job, "progress": str(progress)})],
                            env={**cluster.node_env(), "RAY_ADDRESS": cluster.address}, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)

    def read() -> dict:
        try:
            return json.loads(progress.read_text())
        except (OSError, ValueError):
            return {}

    def resumed(restart: int) -> Resumed | None:
        attempts = read().get("attempts", [])
        if not 0 < restart < len(attempts):
            return None
        from_step, entered_at, first_step_at, *seconds = attempts[restart]
        return Resumed(from_step, entered_at, first_step_at, dict(zip(phases, seconds, strict=True)))

    def resumed_from(restart: int) -> int | None:
        found = resumed(restart)
        return found.from_step if found else None

    return Job(proc, lambda step: read().get("checkpointed", -1) > step, resumed_from, resumed)


def _baseline_job(cfg: config.TrainConfig, cluster: LocalCluster, log: Path) -> Job:
    job = {"train": cfg.to_dict(), "storage": f"{cfg.checkpoint.path}/ray"}
    return baseline_job("spotray.bench.baseline_job", job, cluster, log)


def _wait(predicate: Callable[[], object], proc: subprocess.Popen, what: str, log: Path, timeout_s: float = 600):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise SpotrayError(f"recovery bench: {what} did not happen; see {log}")


def interrupt(start_job: Callable[[LocalCluster, Path], Job], log: Path, faults: tuple[Fault, ...],
              clusters: ReusedCluster) -> list[tuple[Resumed, float, float]]:
    """Runs the job on a whole cluster through ``faults`` in turn: once a checkpoint later than where the job last
    resumed is committed, a worker node gets a notice or is killed, and ``gap_s`` later a replacement node starts.
    Per fault: the attempt resumed after it, the fault's time and the replacement's (UNIX times)."""
    cluster = clusters.get()
    job = start_job(cluster, log)
    times: list[tuple[float, float]] = []
    try:
        for restart, fault in enumerate(faults):
            since = _wait(functools.partial(job.resumed_from, restart), job.proc, f"restart {restart}", log) \
                if restart else 0
            _wait(functools.partial(job.checkpointed_after, since), job.proc, f"a checkpoint after step {since}", log)
            time.sleep(SETTLE_S)
            fault_at = time.time()
            (cluster.preempt_with_notice if fault.kind == "notice" else cluster.kill)(cluster.nodes[-1])
            time.sleep(fault.gap_s)
            times.append((fault_at, time.time()))  # the replacement machine is up and starts Ray
            cluster.add_node(wait=False)
        job.proc.wait(timeout=900)
    finally:
        job.proc.kill()
    resumed = [job.resumed(n) for n in range(1, len(faults) + 1)] if job.proc.returncode == 0 else [None]
    found_all = [found for found in resumed if found is not None]
    if len(found_all) < len(resumed):
        clusters.discard()
        raise SpotrayError(f"recovery bench: {log.stem} failed or never resumed; see {log}")
    return [(found, fault_at, back_at) for found, (fault_at, back_at) in zip(found_all, times, strict=True)]


def from_the_replacement(resumed: Resumed, back_at: float) -> dict:
    """Seconds from the replacement node's start (or the fault, where the run does not wait for one) to the end of
    the first resumed step, split into Ray's part (until the train function starts) and the worker's, with its
    phases."""
    return {"recovery_s": round(resumed.first_step_at - back_at, 2),
            "ray_s": round(resumed.entered_at - back_at, 2),
            "worker_s": round(resumed.first_step_at - resumed.entered_at, 2),
            **{f"{name}_s": round(seconds, 2) for name, seconds in resumed.phases.items()},
            "resumed_from": resumed.from_step}


def _round(fault: str, compared: Fault, cfg_for: Callable[[str, int], config.TrainConfig], i: int, workdir: str,
           clusters: ReusedCluster) -> dict[str, dict]:
    """The baseline's ``compared`` kill (unless ``fault`` is notice), then one spotray run through its faults: the
    compared kill, the notice and the kill timed from the fault, or both."""
    if fault == "shrink":
        return _shrink_round(cfg_for, i, workdir, clusters)
    drills = {}
    if fault != "notice":
        cfg = cfg_for(f"baseline-{i}", 1)
        ((resumed, _, back_at),) = interrupt(functools.partial(_baseline_job, cfg), job_log(workdir, cfg.run.name),
                                             (compared,), clusters)
        drills["baseline"] = from_the_replacement(resumed, back_at)
    faults = {"kill": (compared,), "notice": FROM_THE_FAULT, "both": (compared, *FROM_THE_FAULT)}[fault]
    cfg = cfg_for(f"spotray-{i}", len(faults))
    measured = interrupt(functools.partial(_spotray_job, cfg), job_log(workdir, cfg.run.name), faults, clusters)
    for each, (resumed, fault_at, back_at) in zip(faults, measured, strict=True):
        if each is compared:
            drills["spotray"] = from_the_replacement(resumed, back_at)
        else:
            drills[each.kind] = from_the_replacement(resumed, fault_at)
    return drills


def _shrink_round(cfg_for: Callable[[str, int], config.TrainConfig], i: int, workdir: str,
                  clusters: ReusedCluster) -> dict[str, dict]:
    """A kill with the replacement starting at once (as in ``spotray demo``), timed from the fault: a run that waits
    for it (``kill``, today's behaviour), then one that goes on with the survivor (``shrink``:
    ``scaling.min_workers=1`` and the default ``snapshot.every_steps: auto``)."""
    drills = {}
    for kind, min_workers, snapshots in (("kill", None, 0), ("shrink", 1, config.AUTO)):
        cfg = cfg_for(f"{kind}-{i}", 1)
        cfg = dataclasses.replace(cfg, scaling=dataclasses.replace(cfg.scaling, min_workers=min_workers),
                                  snapshot=config.SnapshotSection(snapshots))
        ((resumed, fault_at, _),) = interrupt(functools.partial(_spotray_job, cfg), job_log(workdir, cfg.run.name),
                                              (Fault("kill", 0.0),), clusters)
        drills[kind] = from_the_replacement(resumed, fault_at)
    return drills


def job_log(workdir: str | Path, name: str) -> Path:
    """Where a bench job's console goes."""
    return Path(workdir) / f"{name}.log"


def progress_file(log: Path) -> Path:
    """Where a baseline job beside ``log`` keeps its progress."""
    return log.with_suffix(".progress.json")


def _figures(drills: dict[str, list[dict]]) -> dict:
    figures = {}
    if "baseline" in drills:
        spotray, baseline = drills["spotray"], drills["baseline"]
        figures.update({
            "recovery_ratio": round(best(spotray, "recovery_s") / best(baseline, "recovery_s"), 3),
            "recovery_ratio_median": round(median(spotray, "recovery_s") / median(baseline, "recovery_s"), 3),
            "worker_ratio": round(best(spotray, "worker_s") / best(baseline, "worker_s"), 3)})
    if "shrink" in drills:
        figures.update({
            "shrink_ratio": round(best(drills["shrink"], "recovery_s") / best(drills["kill"], "recovery_s"), 3),
            "shrink_ratio_median": round(median(drills["shrink"], "recovery_s") / median(drills["kill"], "recovery_s"),
                                         3)})
    if "notice" in drills:
        notice, kill = drills["notice"], drills["kill"]
        figures.update({
            "notice_minus_kill_s": round(best(notice, "recovery_s") - best(kill, "recovery_s"), 2),
            "notice_minus_kill_s_median": round(median(notice, "recovery_s") - median(kill, "recovery_s"), 2)})
    return figures


def run(storages: list[str], s3_endpoint: str | None = None, preset: str = "small", rounds: int = 2,
        every: int = 5, fault: str = "kill", clusters: ReusedCluster | None = None,
        capacity_gap_s: float = CAPACITY_GAP_S) -> dict:
    """``clusters``: where the cluster comes from when it may outlive the bench (the drills', whose nodes already hold
    ``s3_endpoint``'s credentials), else one of its own per storage. ``capacity_gap_s``: how long the cluster stays a
    node short after the compared kill."""
    with scratch_dir() as workdir:
        data_url = bench_corpus(workdir)
        compared = Fault("kill", capacity_gap_s)  # spotray's against the baseline's: timed from the replacement's start
        result = {"machine": machine(), "model": preset, "workers": 2, "checkpoint_every_steps": every, "fault": fault,
                  **({"capacity_gap_s": capacity_gap_s} if fault in ("kill", "both") else {})}
        with contextlib.ExitStack() as stack:
            for storage in storages:
                endpoint = None
                if storage == "s3":  # started before the clusters, so that their nodes inherit its credentials
                    endpoint = s3_endpoint or stack.enter_context(moto_server())
                    ckpt_url = f"{create_bucket(endpoint)}/ckpt"
                else:
                    ckpt_url = f"{workdir}/ckpt"
                cfg_for = _configs(data_url, ckpt_url, endpoint, storage, preset, every)
                with given_or_own(clusters, Path(workdir) / f"ray-{storage}") as reused:
                    # interleaved, so drift on a noisy machine hits both sides alike
                    found = [_round(fault, compared, cfg_for, i, workdir, reused) for i in range(rounds)]
                drills = {key: [each[key] for each in found] for key in found[0]}
                result[storage] = {**drills, **_figures(drills)}
        return result


def _configs(data_url: str, ckpt_url: str, endpoint: str | None, storage: str, preset: str,
             every: int) -> Callable[[str, int], config.TrainConfig]:
    """The config of each drill on ``storage``, by the drill's name and its number of faults."""
    return lambda name, faults: _config(data_url, ckpt_url, endpoint, f"{name}-{storage}", preset, every, faults)


def best(drills: list[dict], key: str) -> float:
    return min(d[key] for d in drills)


def median(drills: list[dict], key: str) -> float:
    return statistics.median(d[key] for d in drills)
