"""``spotray bench goodput``: the demo's drill (a tiny GPT, DDP on 2 workers of a local 3-node Ray cluster) run long
enough for goodput to mean something, with and without what shortens an interruption.

``--faults demo`` (the default): the demo's notice and kill. The baseline waits for the draining node and checkpoints
every 50 steps, the fixed default; spotray moves on the notice (``fault_tolerance.move_on_notice``) and takes the
Young–Daly checkpoint interval (``checkpoint.every_steps: auto``, planned for the drill's own interruption rate).

``--faults kill``: a schedule of kills without notice, each followed by a replacement node only ``capacity_gap_s``
later (a spot pool that takes a while to give a node back). ``off``: no snapshots, the run waits for the replacement;
``on``: in-memory snapshots (``snapshot.every_steps: auto``) and going on with the survivor
(``scaling.min_workers: 1``), growing back once the replacement has joined. Both checkpoint every 50 steps."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from pathlib import Path

import yaml

from spotray import demo
from spotray.bench import planner
from spotray.bench.common import machine, scratch_dir
from spotray.drills.cluster import ReusedCluster, given_or_own
from spotray.errors import SpotrayError

DRILL_INTERRUPTIONS = 2  # the demo's notice and kill
VARIANTS = {
    "baseline": ("fault_tolerance.move_on_notice=false", "checkpoint.every_steps=50"),
    "spotray": ("fault_tolerance.move_on_notice=true", "checkpoint.every_steps=auto"),
}
KILL_VARIANTS = {
    "off": ("snapshot.every_steps=0", "scaling.min_workers=2"),
    "on": ("snapshot.every_steps=auto", "scaling.min_workers=1"),
}
KILLS = 4
CAPACITY_GAP_S = 60.0  # a minute without the lost node: on EKS a GPU spot node's launch and image pull take minutes
STEP_S = 0.05  # a step of the tiny model on 2 CPU workers, about: plans a drill's rate before it has run


def run(steps: int = 6000, rounds: int = 1, clusters: ReusedCluster | None = None, workdir: str | None = None,
        faults: str = "demo", kills: int = KILLS, capacity_gap_s: float = CAPACITY_GAP_S) -> dict:
    """``steps``: the drill's length (6000 is about 5 minutes of training on 2 CPU cores). ``clusters`` and
    ``workdir``: a caller's cluster and a folder that may already hold the demo's corpus (the drills'), else new
    ones. ``kills`` and ``capacity_gap_s``: of ``faults="kill"``."""
    if faults == "kill":
        return _kill_schedule(steps, rounds, clusters, workdir, kills, capacity_gap_s)
    if faults != "demo":
        raise SpotrayError(f"bench goodput: --faults {faults}: give demo (the demo's notice and kill) or kill (a "
                           "schedule of --kills kills)")
    with scratch_dir(workdir) as folder:  # one corpus and one cluster (while it stays whole) for every drill
        results, best = _interleaved(VARIANTS, rounds, clusters, folder, lambda name, _, reused, so_far: _drill(
            folder, reused, steps, VARIANTS[name], so_far["baseline"]))
    return {"machine": machine(), "model": _model(), "steps": steps, **results,
            "goodput_best": best, "goodput_gain": round(best["spotray"] - best["baseline"], 4)}


def _interleaved(variants: Collection[str], rounds: int, clusters: ReusedCluster | None, workdir: str,
                 drill: Callable[[str, int, ReusedCluster, dict[str, list[dict]]], dict]
                 ) -> tuple[dict[str, list[dict]], dict[str, float]]:
    """``drill(variant, round, cluster, results so far)`` of every variant, ``rounds`` times, interleaved so that
    drift on a noisy machine hits them alike; each variant's drills and its best goodput."""
    results: dict[str, list[dict]] = {name: [] for name in variants}
    with given_or_own(clusters, Path(workdir) / "ray-logs") as reused:
        for r in range(rounds):
            for name in variants:
                results[name].append(drill(name, r, reused, results))
    return results, {name: max(d["goodput"] for d in runs) for name, runs in results.items()}


def _model() -> str:
    return yaml.safe_load(Path(demo.demo_config_path()).read_text())["model"]["preset"]


def _drill(workdir: str, clusters: ReusedCluster, steps: int, overrides: tuple[str, ...],
           baselines: list[dict]) -> dict:
    # Planned for the drill's own rate: the baseline's length, or else its steps at ``STEP_S``.
    hours = (baselines[-1]["total_s"] if baselines else steps * STEP_S) / 3600
    rate = f"fault_tolerance.expected_interruptions_per_hour={DRILL_INTERRUPTIONS / hours:.1f}"
    summary = demo.run(workdir, (f"train.max_steps={steps}", *overrides, rate), clusters)
    return {**_measured(summary), "lost_steps_at_most": summary["lost_steps_at_most"], "injected": summary["injected"]}


def _kill_schedule(steps: int, rounds: int, clusters: ReusedCluster | None, workdir: str | None, kills: int,
                   capacity_gap_s: float) -> dict:
    if kills < 1:
        raise SpotrayError(f"bench goodput: --kills {kills}: give 1 or more")
    plan = planner.spread_kills(kills, steps, seed=kills)  # the same schedule for both variants
    hours = (steps * STEP_S + kills * capacity_gap_s) / 3600
    rate = f"fault_tolerance.expected_interruptions_per_hour={kills / hours:.1f}"
    with scratch_dir(workdir) as folder:
        data_url = demo.stdlib_corpus(folder)

        def drill(name: str, r: int, reused: ReusedCluster, _: dict) -> dict:
            run_dir = planner.drill(Path(folder) / f"kills-{name}-{r}", data_url, steps, plan, reused,
                                    (*KILL_VARIANTS[name], "checkpoint.every_steps=50", rate), capacity_gap_s)
            return _measured(json.loads((run_dir / "summary.json").read_text()))

        results, best = _interleaved(KILL_VARIANTS, rounds, clusters, folder, drill)
    return {"machine": machine(), "model": _model(), "steps": steps, "faults": "kill",
            "kills_at_steps": [step for _, step in plan], "capacity_gap_s": capacity_gap_s, **results,
            "goodput_best": best, "goodput_gain": round(best["on"] - best["off"], 4)}


def _measured(summary: dict) -> dict:
    return {"goodput": summary["goodput"], "total_s": summary["time"]["total_s"],
            "seconds": summary["time"]["seconds"], "lost_steps": summary["lost_steps"],
            "events": [{k: e[k] for k in ("kind", "step", "recovery_s", "lost_steps")} for e in summary["events"]]}
