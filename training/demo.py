"""``spotray demo``: the main job on the embedded default, through two spot interruptions.

A local Ray cluster of a head and 2 worker nodes (``ray start`` processes) trains a tiny GPT on the Python
standard library's own source with DDP on 2 workers. One node gets a preemption notice a third of the way in,
another is killed without notice at two thirds; each time a replacement node joins.
"""

from __future__ import annotations

import logging
import os
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from training import config, goodput, launch, ledger
from training.data.prepare import prepare
from training.drills.cluster import LocalCluster
from training.loop import run_root
from training.report import plot_losses
from training.storage import resolve

log = logging.getLogger(__name__)


def stdlib_corpus(workdir: str) -> str:
    """Tokenize the Python standard library's own source once; later demos reuse it."""
    data_url = resolve(workdir).child("data", "stdlib").url
    if not resolve(data_url).child("index.json").exists():
        prepare(f"{sysconfig.get_paths()['stdlib']}/**/*.py", data_url)
    return data_url


def demo_config_path() -> str:
    return str(resources.files("training") / "configs" / "demo.yaml")


@dataclass
class FaultInjector:
    """Watches the run's progress in storage and interrupts it at the planned steps (notice, then kill)."""

    cluster: LocalCluster
    attempts: object  # the run's attempts Location
    plan: list[tuple[str, int]]
    injected: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> FaultInjector:
        threading.Thread(target=self._run, daemon=True, name="fault-injector").start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        for kind, at_step in self.plan:
            while not self._stop.is_set() and self._current_step() < at_step:
                time.sleep(0.2)
            if self._stop.is_set():
                return
            victim = self.cluster.nodes[-1]  # the newest worker node runs a training worker
            (self.cluster.preempt_with_notice if kind == "notice" else self.cluster.kill)(victim)
            self.injected.append({"kind": kind, "at": time.time(), "step_seen": self._current_step()})
            self.cluster.add_node()  # the replacement spot node

    def _current_step(self) -> int:
        attempts = ledger.read_attempts(self.attempts)
        status = goodput.read_status(self.attempts, attempts[-1].attempt_id) if attempts else None
        return (status or {}).get("step") or 0


def run(workdir: str) -> dict:
    data_url = stdlib_corpus(workdir)
    run_name = time.strftime("demo-%Y%m%d-%H%M%S")
    root_url = resolve(workdir).url
    cfg = config.load(demo_config_path(), [f"data.path={data_url}", f"checkpoint.path={root_url}",
                                           f"run.name={run_name}", f"audit_dir={root_url}/audit/{run_name}"])
    steps, every = cfg.train.max_steps, cfg.checkpoint.every_steps
    plan = [("notice", steps // 3 + every // 2), ("kill", 2 * steps // 3 + every // 2)]
    with LocalCluster(Path(workdir) / "ray-logs" / run_name, drain_timeout_s=20).start(workers=2) as cluster:
        os.environ.update({k: v for k, v in cluster.node_env().items() if k.startswith("RAY_")})
        import ray

        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        injector = FaultInjector(cluster, run_root(cfg).child("attempts"), plan).start()
        try:
            summary = launch.run(cfg)
        finally:
            injector.stop()
            ray.shutdown()
    summary["loss_curve_png"] = plot_losses(summary, str(Path(run_root(cfg).path) / "loss_curve.png"))
    return summary
