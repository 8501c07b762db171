"""``spotray bench recovery``: seconds from a replacement node joining to the first resumed training step, for
spotray and for plain Ray Train with a rank-0 ``torch.save`` checkpoint, on the same kill drill and model.

Each drill: a head plus 2 worker nodes; once a checkpoint exists, a worker node is SIGKILLed; after a pause
(Ray has noticed and waits for capacity) a replacement node joins; the clock runs until a resumed step ends."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from training import config, goodput, ledger
from training.bench.common import bench_corpus, machine, new_workdir
from training.checkpoint import checkpoints_root, list_committed
from training.drills.cluster import LocalCluster
from training.errors import SpotrayError
from training.loop import run_root

CAPACITY_GAP_S = 10.0  # how long the cluster stays a node short before the replacement joins
SETTLE_S = 1.0  # after the first checkpoint, so that Ray has registered the baseline's too


def _config(data_url: str, workdir: str, name: str, preset: str, every: int) -> config.TrainConfig:
    return config.load(None, [
        f"data.path={data_url}", f"checkpoint.path={workdir}/ckpt", f"run.name={name}", f"model.preset={preset}",
        "train.seq_len=128", "train.global_batch_size=8", f"train.max_steps={3 * every}", "train.log_every=1",
        f"checkpoint.every_steps={every}", "checkpoint.keep_last=2", "scaling.num_workers=2",
    ])


def _spotray_job(cfg: config.TrainConfig, cluster: LocalCluster, log: Path):
    config_file = log.with_suffix(".yaml")
    config_file.write_text(yaml.safe_dump(cfg.to_dict()))
    proc = subprocess.Popen([sys.executable, "-m", "training.cli", "train", "--config", str(config_file)],
                            env={**cluster.node_env(), "RAY_ADDRESS": cluster.address}, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    attempts = run_root(cfg).child("attempts")

    def checkpointed() -> bool:
        return bool(list_committed(checkpoints_root(run_root(cfg))))

    def resumed() -> tuple[int, float] | None:
        found = ledger.read_attempts(attempts)
        status = goodput.read_status(attempts, found[-1].attempt_id) if len(found) > 1 else None
        first_step_at = (status or {}).get("first_step_at")
        return (found[-1].from_step, first_step_at) if first_step_at else None

    return proc, checkpointed, resumed


def _baseline_job(cfg: config.TrainConfig, cluster: LocalCluster, log: Path):
    progress = Path(cfg.checkpoint.path) / f"{cfg.run.name}-progress.json"
    job = {"train": cfg.to_dict(), "storage": str(Path(cfg.checkpoint.path) / "ray"), "progress": str(progress)}
    proc = subprocess.Popen([sys.executable, "-m", "training.bench.baseline_job", json.dumps(job)],
                            env={**cluster.node_env(), "RAY_ADDRESS": cluster.address}, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)

    def read() -> dict:
        try:
            return json.loads(progress.read_text())
        except (OSError, ValueError):
            return {}

    def resumed() -> tuple[int, float] | None:
        attempts = read().get("attempts", [])
        return tuple(attempts[-1]) if len(attempts) > 1 else None

    return proc, lambda: "checkpointed" in read(), resumed


def _wait(predicate: Callable[[], object], proc: subprocess.Popen, what: str, log: Path, timeout_s: float = 600):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise SpotrayError(f"recovery bench: {what} did not happen; see {log}")


def _drill(start_job, cfg: config.TrainConfig, workdir: str) -> tuple[float, int]:
    """Returns (seconds from the replacement node joining to the end of the first resumed step, resumed step)."""
    log = Path(workdir) / f"{cfg.run.name}.log"
    with LocalCluster(Path(workdir) / f"ray-{cfg.run.name}", drain_timeout_s=20).start(workers=2) as cluster:
        proc, checkpointed, resumed = start_job(cfg, cluster, log)
        try:
            _wait(checkpointed, proc, "a first checkpoint", log)
            time.sleep(SETTLE_S)
            cluster.kill(cluster.nodes[-1])
            time.sleep(CAPACITY_GAP_S)
            cluster.add_node()
            back_at = time.time()
            from_step, first_step_at = _wait(resumed, proc, "a resumed step", log)
            proc.wait(timeout=600)
        finally:
            proc.kill()
    if proc.returncode != 0:
        raise SpotrayError(f"recovery bench: {cfg.run.name} failed; see {log}")
    return first_step_at - back_at, from_step


def run(preset: str = "small", rounds: int = 2, every: int = 5) -> dict:
    workdir = new_workdir()
    data_url = bench_corpus(workdir)
    spotray, baseline = [], []
    for i in range(rounds):  # interleaved, so drift on a noisy machine hits both sides alike
        baseline.append(_drill(_baseline_job, _config(data_url, workdir, f"baseline-{i}", preset, every), workdir))
        spotray.append(_drill(_spotray_job, _config(data_url, workdir, f"spotray-{i}", preset, every), workdir))
    return {
        "machine": machine(), "model": preset, "workers": 2, "checkpoint_every_steps": every,
        "capacity_gap_s": CAPACITY_GAP_S,
        "baseline_recovery_s": [round(s, 2) for s, _ in baseline],
        "baseline_resumed_from": [step for _, step in baseline],
        "spotray_recovery_s": [round(s, 2) for s, _ in spotray],
        "spotray_resumed_from": [step for _, step in spotray],
        "recovery_ratio": round(min(s for s, _ in spotray) / min(s for s, _ in baseline), 3),
    }
