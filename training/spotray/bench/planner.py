"""``spotray bench planner``: the planner's goodput against goodput measured at several interruption rates.

A calibration drill (the demo's run on a local 3-node Ray cluster, one kill halfway) measures the run's times; then
drills with kills at seeded random times of a Poisson process at 1, 2 and 3 faults per run. The planner, fed the
calibration's times and each drill's count of kills, predicts that drill's goodput, which its ledger measured.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import yaml

from spotray import config, demo
from spotray.bench.common import machine, new_workdir
from spotray.drills.cluster import ReusedCluster, given_or_own
from spotray.errors import SpotrayError
from spotray.planning import calibration, planner
from spotray.worker.attempt import run_root

FAULTS_PER_RUN = (1.0, 2.0, 3.0)
WITHIN = 0.05  # of goodput: the planner's prediction is good enough to plan by


def drill(workdir: Path, data_url: str, steps: int, plan: list[tuple[str, int]], clusters: ReusedCluster) -> Path:
    """The demo's run with faults at ``plan``'s steps, a replacement node after each; returns the run's folder."""
    cfg = config.load(demo.demo_config_path(), [f"data.path={data_url}", f"checkpoint.path={workdir}",
                                                "run.name=drill", f"train.max_steps={steps}"])
    root = run_root(cfg)
    Path(root.path).mkdir(parents=True, exist_ok=True)
    config_file = Path(root.path) / "config.yaml"
    config_file.write_text(yaml.safe_dump(cfg.to_dict()))
    cluster = clusters.get()
    injector = demo.FaultInjector(cluster, root.child("attempts"), plan).start()
    try:
        driver = subprocess.run([sys.executable, "-m", "spotray.cli", "train", "--config", str(config_file)],
                                env={**cluster.node_env(), "RAY_ADDRESS": cluster.address},
                                stdout=subprocess.DEVNULL, timeout=1800)
    finally:
        injector.stop()
    if driver.returncode != 0:
        clusters.discard()
        raise SpotrayError(f"bench planner: a drill failed; Ray's logs are in {clusters.log_dir}")
    if len(injector.injected) != len(plan):
        raise SpotrayError(f"bench planner: injected {injector.injected}, planned {plan}")
    return Path(root.path)


def poisson_kills(rate_per_s: float, wall_per_step_s: float, steps: int, seed: int) -> list[tuple[str, int]]:
    """Kills at the steps a Poisson process of ``rate_per_s`` reaches, in wall seconds of training; none in the last
    100 steps (the run could be finished) or within 60 of the previous one (a checkpoint and the restart between)."""
    rng, at_s = random.Random(seed), 0.0
    plan: list[tuple[str, int]] = []
    while True:
        at_s += rng.expovariate(rate_per_s)
        step = int(at_s / wall_per_step_s)
        if step >= steps - 100:
            return plan
        if not plan or step > plan[-1][1] + 60:
            plan.append(("kill", step))


def run(steps: int = 1800, faults_per_run: tuple[float, ...] = FAULTS_PER_RUN, clusters: ReusedCluster | None = None,
        workdir: str | None = None) -> dict:
    """``clusters`` and ``workdir``: a caller's cluster and a folder that may already hold the demo's corpus (the
    drills'), else new ones."""
    if steps < 300:
        raise SpotrayError(f"bench planner: --steps {steps}: give at least 300 (a kill needs room to land and recover)")
    workdir = workdir or new_workdir()
    data_url = demo.stdlib_corpus(workdir)
    with given_or_own(clusters, Path(workdir) / "ray-logs") as reused:
        return _run(Path(workdir), data_url, steps, faults_per_run, reused)


def _run(workdir: Path, data_url: str, steps: int, faults_per_run: tuple[float, ...], clusters: ReusedCluster) -> dict:
    calibrated = calibration.inputs_from_run(str(drill(workdir / "calibration", data_url, steps,
                                                          [("kill", steps // 2)], clusters)))
    times = {k: v for k, v in calibrated.values.items() if k not in ("interruptions", "notice_share")}
    wall_per_step = times["step_s"] + times["overhead_s_per_step"]
    drills = []
    for seed, faults in enumerate(faults_per_run):
        plan = poisson_kills(faults / (steps * wall_per_step), wall_per_step, steps, seed)
        started = time.monotonic()
        measured = calibration.inputs_from_run(str(drill(workdir / f"rate-{seed}", data_url, steps, plan,
                                                            clusters)))
        predicted = next(p for p in planner.plan(planner.Inputs(**times, interruptions=len(plan)))
                         if p.nodes == times["nodes"][0] and p.capacity == "spot")
        drills.append({"planned_faults_per_run": faults, "kills": len(plan), "predicted_goodput": predicted.goodput,
                       "measured_goodput": measured.goodput, "seconds": round(time.monotonic() - started)})
    gap = max(abs(d["predicted_goodput"] - d["measured_goodput"]) for d in drills)
    return {"machine": machine(), "model": "tiny", "steps": steps, "drills": drills, "largest_gap": round(gap, 4),
            "within_5_points": gap < WITHIN}
