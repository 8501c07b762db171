"""``spotray bench planner``: the planner checked on runs it has not seen.

A calibration drill (the demo's run on a local 3-node Ray cluster, one kill halfway, after a fault-free warm-up run)
measures the run's step, save, restore and restart times. Then drills the calibration never saw, each with a fixed
count of kills (by default 1, 2 and 4: at least one drill must have 3 or more, and each must get every kill it
planned), spread over the run with a seeded jitter, each count repeated ``rounds`` times. The planner, fed the
calibration's times and a drill's count of kills, predicts that drill's goodput, which the drill's ledger measured
(and again with the drill's own step time, which drifts between runs on a shared machine); the spread between the
repeats of a count is the noise the prediction is judged against.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from spotray import config, demo
from spotray.bench.common import machine, scratch_dir
from spotray.drills.cluster import ReusedCluster, given_or_own
from spotray.errors import SpotrayError
from spotray.planning import calibration, planner
from spotray.worker.attempt import run_root

KILLS = (1, 2, 4)
SEVERAL = 3  # the most kills of a drill must be at least this: the loss of several faults in one run is checked
WITHIN = 0.05  # of goodput: the planner's prediction is good enough to plan by
TAIL_STEPS = 100  # no kill this close to the end: the run could be finished before it lands
GAP_STEPS = 60  # nor this close to the previous one: a checkpoint and the restart between


def drill(workdir: Path, data_url: str, steps: int, plan: list[tuple[str, int]], clusters: ReusedCluster,
          overrides: tuple[str, ...] = (), capacity_gap_s: float = 0.0) -> Path:
    """The demo's run (with ``overrides``) with faults at ``plan``'s steps, a replacement node ``capacity_gap_s`` after
    each; returns the run's folder, which holds its ``summary.json``."""
    cfg = config.load(demo.demo_config_path(), [f"data.path={data_url}", f"checkpoint.path={workdir}",
                                                "run.name=drill", f"train.max_steps={steps}", *overrides])
    root = run_root(cfg)
    Path(root.path).mkdir(parents=True, exist_ok=True)
    config_file = Path(root.path) / "config.yaml"
    config_file.write_text(yaml.safe_dump(cfg.to_dict()))
    cluster = clusters.get()
    injector = demo.FaultInjector(cluster, root.child("attempts"), plan, capacity_gap_s).start()
    try:
        driver = subprocess.run([sys.executable, "-m", "spotray.cli", "train", "--config", str(config_file),
                                 "--summary-json", str(Path(root.path) / "summary.json")],
                                env={**cluster.node_env(), "RAY_ADDRESS": cluster.address},
                                stdout=subprocess.DEVNULL, timeout=1800)
    finally:
        injector.stop()
    if driver.returncode != 0:
        clusters.discard()
        raise SpotrayError(f"bench: a fault drill failed; Ray's logs are in {clusters.log_dir}")
    if len(injector.injected) != len(plan):
        raise SpotrayError(f"bench: a fault drill injected {injector.injected}, planned {plan}")
    return Path(root.path)


def spread_kills(kills: int, steps: int, seed: int) -> list[tuple[str, int]]:
    """``kills`` kills evenly over the run's first ``steps - TAIL_STEPS`` steps, each moved by a seeded jitter of up
    to a sixth of the spacing (so repeats land at other points of the checkpoint interval)."""
    spacing = (steps - TAIL_STEPS) / (kills + 1)
    if spacing < GAP_STEPS * 1.5:
        raise SpotrayError(f"--steps {steps} is too few for {kills} kills: give at least "
                           f"{int(TAIL_STEPS + GAP_STEPS * 1.5 * (kills + 1)) + 1}")
    rng = random.Random(seed)
    jitter = int(spacing / 6)
    return [("kill", round(spacing * (i + 1)) + rng.randint(-jitter, jitter)) for i in range(kills)]


def run(steps: int = 1800, kills: tuple[int, ...] = KILLS, rounds: int = 2, clusters: ReusedCluster | None = None,
        workdir: str | None = None) -> dict:
    """``clusters`` and ``workdir``: a caller's cluster and a folder that may already hold the demo's corpus (the
    drills'), else new ones."""
    if not kills or min(kills) < 1 or max(kills) < SEVERAL:
        raise SpotrayError(f"bench planner: --kills {','.join(map(str, kills))}: give counts of 1 or more, one of "
                           f"them {SEVERAL} or more (e.g. 1,2,4)")
    spread_kills(max(kills), steps, seed=0)  # the most kills fit, or one line says how many steps would
    plans = {count: [spread_kills(count, steps, seed=100 * count + r) for r in range(rounds)] for count in kills}
    with scratch_dir(workdir) as folder:
        data_url = demo.stdlib_corpus(folder)
        with given_or_own(clusters, Path(folder) / "ray-logs") as reused:
            return _run(Path(folder), data_url, steps, plans, reused)


def _run(workdir: Path, data_url: str, steps: int, plans: dict[int, list[list[tuple[str, int]]]],
         clusters: ReusedCluster) -> dict:
    # The first run of a cluster pays for cold imports and caches: the calibration runs as warm as the drills do.
    drill(workdir / "warm-up", data_url, max(TAIL_STEPS, steps // 6), [], clusters)
    calibrated = calibration.inputs_from_run(str(drill(workdir / "calibration", data_url, steps,
                                                          [("kill", steps // 2)], clusters)))
    times = {k: v for k, v in calibrated.values.items() if k not in ("interruptions", "notice_share")}
    drills: list[dict[str, Any]] = []
    for count, repeats in plans.items():
        for r, plan in enumerate(repeats):
            started = time.monotonic()
            measured = calibration.inputs_from_run(str(drill(workdir / f"kills-{count}-{r}", data_url, steps, plan,
                                                                clusters)))
            if measured.values["interruptions"] != count:
                raise SpotrayError(f"bench planner: {count} kills injected, {measured.values['interruptions']} spot "
                                   f"interruptions on record in {measured.url}")
            predicted = _spot_plan(times, count)
            # The step time drifts between runs on a shared machine (10-30 % on cpu-2c): the same prediction with the
            # drill's own step time separates the fault model's error from that drift.
            own_step = _spot_plan({**times, "step_s": measured.values["step_s"],
                                   "overhead_s_per_step": measured.values["overhead_s_per_step"]}, count)
            drills.append({"kills": count, "at_steps": [step for _, step in plan],
                           "predicted_goodput": round(predicted.goodput, 4),
                           "predicted_goodput_at_its_step_time": round(own_step.goodput, 4),
                           "measured_goodput": round(measured.goodput, 4),
                           "seconds": round(time.monotonic() - started)})
    gap = max(abs(d["predicted_goodput"] - d["measured_goodput"]) for d in drills)
    own_gap = max(abs(d["predicted_goodput_at_its_step_time"] - d["measured_goodput"]) for d in drills)
    spread = {str(count): round(max(d["measured_goodput"] for d in drills if d["kills"] == count)
                                - min(d["measured_goodput"] for d in drills if d["kills"] == count), 4)
              for count in plans}
    return {"machine": machine(), "model": "tiny", "steps": steps,
            "calibration": {"goodput": round(calibrated.goodput, 4), "times": _rounded(times)},
            "drills": drills, "largest_gap": round(gap, 4), "within_5_points": gap < WITHIN,
            "largest_gap_at_their_step_time": round(own_gap, 4),
            "spread_between_repeats": spread}


def _spot_plan(times: dict, kills: int) -> planner.Plan:
    return next(p for p in planner.plan(planner.Inputs(**times, interruptions=kills))
                if p.nodes == times["nodes"][0] and p.capacity == "spot")


def _rounded(times: dict) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in times.items()}
