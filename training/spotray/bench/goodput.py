"""``spotray bench goodput``: the demo's drill (a tiny GPT, DDP on 2 workers of a local 3-node Ray cluster, one
preemption notice and one node killed) run long enough for goodput to mean something, with and without what
shortens a preemption: moving on the notice (``fault_tolerance.move_on_notice``) and the Young–Daly checkpoint
interval (``checkpoint.every_steps: auto``, planned for the drill's own interruption rate). The baseline waits for
the draining node and checkpoints every 50 steps, the fixed default."""

from __future__ import annotations

from pathlib import Path

import yaml

from spotray import demo
from spotray.bench.common import machine, new_workdir
from spotray.drills.cluster import ReusedCluster, given_or_own

DRILL_INTERRUPTIONS = 2  # the demo's notice and kill
VARIANTS = {
    "baseline": ("fault_tolerance.move_on_notice=false", "checkpoint.every_steps=50"),
    "spotray": ("fault_tolerance.move_on_notice=true", "checkpoint.every_steps=auto"),
}


def run(steps: int = 6000, rounds: int = 1, clusters: ReusedCluster | None = None, workdir: str | None = None) -> dict:
    """``steps``: the drill's length (6000 is about 5 minutes of training on 2 CPU cores). ``clusters`` and
    ``workdir``: a caller's cluster and a folder that may already hold the demo's corpus (the drills'), else new
    ones."""
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    workdir = workdir or new_workdir()  # one corpus and one cluster (while it stays whole) for every drill
    with given_or_own(clusters, Path(workdir) / "ray-logs") as reused:
        for _ in range(rounds):  # interleaved, so drift on a noisy machine hits both alike
            for name, overrides in VARIANTS.items():
                results[name].append(_drill(workdir, reused, steps, overrides, results["baseline"]))
    best = {name: max(r["goodput"] for r in runs) for name, runs in results.items()}
    model = yaml.safe_load(Path(demo.demo_config_path()).read_text())["model"]["preset"]
    return {"machine": machine(), "model": model, "steps": steps, **results,
            "goodput_best": best, "goodput_gain": round(best["spotray"] - best["baseline"], 4)}


def _drill(workdir: str, clusters: ReusedCluster, steps: int, overrides: tuple[str, ...],
           baselines: list[dict]) -> dict:
    # Planned for the drill's own rate: the baseline's length, or else about a step per 50 ms.
    hours = (baselines[-1]["total_s"] if baselines else steps * 0.05) / 3600
    rate = f"fault_tolerance.expected_interruptions_per_hour={DRILL_INTERRUPTIONS / hours:.1f}"
    summary = demo.run(workdir, (f"train.max_steps={steps}", *overrides, rate), clusters)
    return {"goodput": summary["goodput"], "total_s": summary["time"]["total_s"],
            "seconds": summary["time"]["seconds"], "lost_steps": summary["lost_steps"],
            "lost_steps_at_most": summary["lost_steps_at_most"],
            "events": [{k: e[k] for k in ("kind", "step", "recovery_s", "lost_steps")} for e in summary["events"]],
            "injected": summary["injected"]}
