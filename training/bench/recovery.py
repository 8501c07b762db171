"""``spotray bench recovery``: seconds from a replacement node joining to the first resumed training step, for
spotray and for plain Ray Train with a rank-0 ``torch.save`` checkpoint, on the same kill drill and model.
``--fault notice``: spotray alone, seconds from the fault to the first resumed step after a preemption notice
against after a kill, the replacement node starting at the fault in both (as in ``spotray demo``). ``--fault both``:
the two, one after the other on the same cluster.

Each drill: a head plus 2 worker nodes (the cluster the previous drill left whole, or a new one); once a checkpoint
exists, a worker node is SIGKILLed; after a pause (Ray has noticed and waits for capacity) a replacement node starts;
the clock runs from its start until a resumed step ends, as each job records it: nothing polls storage or the
cluster while the clock runs.
Checkpoints go to each storage asked for: a local dir (shared by the local "nodes", which real nodes never are)
and S3 (a moto server on loopback), where spot training keeps them."""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from spotray import config, goodput, ledger
from spotray.bench.common import bench_corpus, machine, new_workdir
from spotray.checkpoint import checkpoints_root, list_committed
from spotray.drills.cluster import LocalCluster, ReusedCluster, given_or_own
from spotray.drills.s3local import create_bucket, moto_server
from spotray.errors import SpotrayError
from spotray.loop import run_root
from spotray.storage import Location

CAPACITY_GAP_S = 10.0  # how long the cluster stays a node short before the replacement joins
SETTLE_S = 1.0  # after the first checkpoint, so that Ray has registered the baseline's too


def _config(data_url: str, ckpt_url: str, endpoint: str | None, name: str, preset: str,
            every: int) -> config.TrainConfig:
    return config.load(None, [
        f"data.path={data_url}", f"checkpoint.path={ckpt_url}", f"run.name={name}", f"model.preset={preset}",
        "train.seq_len=128", "train.global_batch_size=8", f"train.max_steps={3 * every}", "train.log_every=1",
        f"checkpoint.every_steps={every}", "checkpoint.keep_last=2", "scaling.num_workers=2",
        "env.on_nodes=true",  # the nodes inherit the storage credentials, as the RayJob's pods get them
        *([f"storage.endpoint_url={endpoint}"] if endpoint else []),
    ])


@dataclass(frozen=True)
class _Resumed:
    """The first resumed attempt as a job reports it (UNIX times)."""

    from_step: int
    entered_at: float  # the train function started on the new worker group
    first_step_at: float  # its first step ended
    phases: dict[str, float] = field(default_factory=dict)  # seconds of named parts of the in-worker time


def _spotray_job(cfg: config.TrainConfig, cluster: LocalCluster, log: Path):
    config_file = log.with_suffix(".yaml")
    config_file.write_text(yaml.safe_dump(cfg.to_dict()))
    proc = subprocess.Popen([sys.executable, "-m", "spotray.cli", "train", "--config", str(config_file)],
                            env={**cluster.node_env(), "RAY_ADDRESS": cluster.address}, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    attempts = run_root(cfg).child("attempts")

    def checkpointed() -> bool:
        return bool(list_committed(checkpoints_root(run_root(cfg)), warn=False))

    return proc, checkpointed, lambda: spotray_resumed(attempts, ("startup", "restore"))


def spotray_resumed(attempts: Location, phases: tuple[str, ...]) -> _Resumed | None:
    """The second attempt of a spotray run as its ledger records it, once its first step has ended."""
    found = ledger.read_attempts(attempts)
    status = goodput.read_status(attempts, found[-1].attempt_id) if len(found) > 1 else None
    if not (status or {}).get("first_step_at"):
        return None
    return _Resumed(found[-1].from_step, status["entered_at"], status["first_step_at"],
                    {phase: status[f"{phase}_s"] for phase in phases})


def start_baseline(module: str, job: dict, cluster: LocalCluster, log: Path) -> tuple[subprocess.Popen, Callable]:
    """``python -m module JOB`` on the cluster; the process, and a reader of the progress file it keeps."""
    progress = Path(job["progress"])
    proc = subprocess.Popen([sys.executable, "-m", module, json.dumps(job)],
                            env={**cluster.node_env(), "RAY_ADDRESS": cluster.address}, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)

    def read() -> dict:
        try:
            return json.loads(progress.read_text())
        except (OSError, ValueError):
            return {}

    return proc, read


def _baseline_job(cfg: config.TrainConfig, cluster: LocalCluster, log: Path):
    job = {"train": cfg.to_dict(), "storage": f"{cfg.checkpoint.path}/ray",
           "progress": str(log.with_suffix(".progress.json"))}
    proc, read = start_baseline("spotray.bench.baseline_job", job, cluster, log)

    def resumed() -> _Resumed | None:
        attempts = read().get("attempts", [])
        return _Resumed(*attempts[-1]) if len(attempts) > 1 else None

    return proc, lambda: "checkpointed" in read(), resumed


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


def _interrupt(start_job, cfg: config.TrainConfig, workdir: str, kind: str, gap_s: float,
               clusters: ReusedCluster) -> tuple[_Resumed, float, float]:
    """Runs the job on a whole cluster; once it has checkpointed, a worker node gets a notice or is killed
    (``kind``), and ``gap_s`` later a replacement node starts. Returns the resumed attempt, the fault's time and
    the replacement's (UNIX times)."""
    log = Path(workdir) / f"{cfg.run.name}.log"
    cluster = clusters.get()
    proc, checkpointed, resumed = start_job(cfg, cluster, log)
    try:
        _wait(checkpointed, proc, "a first checkpoint", log)
        time.sleep(SETTLE_S)
        fault_at = time.time()
        (cluster.preempt_with_notice if kind == "notice" else cluster.kill)(cluster.nodes[-1])
        time.sleep(gap_s)
        back_at = time.time()  # the replacement machine is up and starts Ray
        # Nothing polls the node or the job from here on: both record their own timestamps, read at the end.
        cluster.add_node(wait=False)
        proc.wait(timeout=600)
    finally:
        proc.kill()
    resumed_at = resumed() if proc.returncode == 0 else None
    if resumed_at is None:
        clusters.discard()
        raise SpotrayError(f"recovery bench: {cfg.run.name} failed or never resumed; see {log}")
    return resumed_at, fault_at, back_at


def _drill(start_job, cfg: config.TrainConfig, workdir: str, clusters: ReusedCluster) -> dict:
    """Seconds from the replacement node joining to the end of the first resumed step, split into Ray's part
    (until the train function starts) and the worker's."""
    resumed_at, _, back_at = _interrupt(start_job, cfg, workdir, "kill", CAPACITY_GAP_S, clusters)
    return {"recovery_s": round(resumed_at.first_step_at - back_at, 2),
            "ray_s": round(resumed_at.entered_at - back_at, 2),
            "worker_s": round(resumed_at.first_step_at - resumed_at.entered_at, 2),
            **{f"{name}_s": round(seconds, 2) for name, seconds in resumed_at.phases.items()},
            "resumed_from": resumed_at.from_step}


def _fault_drill(kind: str, cfg: config.TrainConfig, workdir: str, clusters: ReusedCluster) -> dict:
    """Seconds from a notice (or a kill) of a worker node to the end of the first resumed step, with the
    replacement node starting at once."""
    resumed_at, fault_at, _ = _interrupt(_spotray_job, cfg, workdir, kind, 0.0, clusters)
    return {"recovery_s": round(resumed_at.first_step_at - fault_at, 2), "resumed_from": resumed_at.from_step}


def _notice_against_kill(cfg_for: Callable[[str], config.TrainConfig], workdir: str, rounds: int,
                         clusters: ReusedCluster) -> dict:
    drills: dict[str, list[dict]] = {"notice": [], "kill": []}
    for i in range(rounds):  # interleaved, so drift on a noisy machine hits both alike
        for kind, found in drills.items():
            found.append(_fault_drill(kind, cfg_for(f"{kind}-{i}"), workdir, clusters))
    notice, kill = drills["notice"], drills["kill"]
    return {**drills,
            "notice_minus_kill_s": round(_best(notice, "recovery_s") - _best(kill, "recovery_s"), 2),
            "notice_minus_kill_s_median": round(_median(notice, "recovery_s") - _median(kill, "recovery_s"), 2)}


def _compare(cfg_for: Callable[[str], config.TrainConfig], workdir: str, rounds: int,
             clusters: ReusedCluster) -> dict:
    spotray, baseline = [], []
    for i in range(rounds):  # interleaved, so drift on a noisy machine hits both sides alike
        for name, job, drills in (("baseline", _baseline_job, baseline), ("spotray", _spotray_job, spotray)):
            drills.append(_drill(job, cfg_for(f"{name}-{i}"), workdir, clusters))
    return {
        "baseline": baseline, "spotray": spotray,
        "recovery_ratio": round(_best(spotray, "recovery_s") / _best(baseline, "recovery_s"), 3),
        "recovery_ratio_median": round(_median(spotray, "recovery_s") / _median(baseline, "recovery_s"), 3),
        "worker_ratio": round(_best(spotray, "worker_s") / _best(baseline, "worker_s"), 3),
    }


COMPARISONS = {"kill": (_compare,), "notice": (_notice_against_kill,), "both": (_compare, _notice_against_kill)}


def run(storages: list[str], s3_endpoint: str | None = None, preset: str = "small", rounds: int = 2,
        every: int = 5, fault: str = "kill", clusters: ReusedCluster | None = None) -> dict:
    """``fault="both"``: the kill and the notice comparisons on one corpus and one cluster per storage, their keys
    side by side in each storage's result. ``clusters``: where the cluster comes from when it may outlive the bench
    (the drills', whose nodes already hold ``s3_endpoint``'s credentials), else one of its own per storage."""
    workdir = new_workdir()
    data_url = bench_corpus(workdir)
    result = {"machine": machine(), "model": preset, "workers": 2, "checkpoint_every_steps": every, "fault": fault,
              **({"capacity_gap_s": CAPACITY_GAP_S} if _compare in COMPARISONS[fault] else {})}
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
                result[storage] = {key: value for compare in COMPARISONS[fault]
                                   for key, value in compare(cfg_for, workdir, rounds, reused).items()}
    return result


def _configs(data_url: str, ckpt_url: str, endpoint: str | None, storage: str, preset: str,
             every: int) -> Callable[[str], config.TrainConfig]:
    """The config of each drill on ``storage``, by the drill's name."""
    return lambda name: _config(data_url, ckpt_url, endpoint, f"{name}-{storage}", preset, every)


def _best(drills: list[dict], key: str) -> float:
    return min(d[key] for d in drills)


def _median(drills: list[dict], key: str) -> float:
    return statistics.median(d[key] for d in drills)
