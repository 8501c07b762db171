"""``spotray demo``: the main job on the embedded default, through two spot interruptions.

A local Ray cluster of a head and 2 worker nodes (``ray start`` processes) trains a tiny GPT on the Python
standard library's own source with DDP on 2 workers. One node gets a preemption notice a third of the way in,
another is killed without notice at two thirds; each time a replacement node joins.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from spotray import config
from spotray.accounts import goodput, ledger
from spotray.data.prepare import prepare
from spotray.drills.cluster import LocalCluster, ReusedCluster, given_or_own
from spotray.errors import TrainingFailed
from spotray.reports.summary import plot_losses
from spotray.storage import Location, resolve
from spotray.worker.attempt import run_root
from spotray.worker.cadence import nominal_every_steps

VAL_FRACTION = 0.02


def stdlib_corpus(workdir: str) -> str:
    """Tokenize the Python standard library's own source once, with a validation split; later demos reuse it."""
    data_url = resolve(workdir).child("data", "stdlib-val").url
    if not resolve(data_url).child("index.json").exists():
        prepare(f"{sysconfig.get_paths()['stdlib']}/**/*.py", data_url, val_fraction=VAL_FRACTION)
    return data_url


def demo_config_path() -> str:
    return str(resources.files("spotray") / "configs" / "demo.yaml")


@dataclass
class FaultInjector:
    """Watches the run's progress in storage and interrupts it at the planned steps (notice, then kill), each once the
    run is back at its configured size (a run that went on with fewer workers has a node with no worker to lose)."""

    cluster: LocalCluster
    attempts: Location  # the run's ledger
    plan: list[tuple[str, int]]
    capacity_gap_s: float = 0.0  # how long the cluster stays a node short after each fault
    injected: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _known: dict[str, ledger.AttemptInfo] = field(default_factory=dict)  # attempt records read so far

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
            if self._stop.wait(self.capacity_gap_s):
                return
            self.cluster.add_node()  # the replacement spot node

    def _current_step(self) -> int:
        """The step of the attempt training now, 0 while it runs below its configured size."""
        attempts = ledger.read_attempts(self.attempts, self._known)
        if not attempts or attempts[-1].world_size < attempts[-1].configured_workers:
            return 0
        status = goodput.read_status(self.attempts, attempts[-1].attempt_id)
        return (status or {}).get("step") or 0


def run(workdir: str, overrides: tuple[str, ...] = (), clusters: ReusedCluster | None = None) -> dict:
    """``clusters``: where the cluster comes from when it may outlive this run (a bench's drills), else a new one."""
    data_url = stdlib_corpus(workdir)
    run_name = time.strftime("demo-%Y%m%d-%H%M%S")
    root_url = resolve(workdir).url
    cfg = config.load(demo_config_path(), [f"data.path={data_url}", f"checkpoint.path={root_url}",
                                           f"run.name={run_name}", f"audit_dir={root_url}/audit/{run_name}",
                                           *overrides])
    steps, every = cfg.train.max_steps, nominal_every_steps(cfg.checkpoint.every_steps)
    plan = [("notice", steps // 3 + every // 2), ("kill", 2 * steps // 3 + every // 2)]
    run_dir = Path(run_root(cfg).path)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_file, summary_file = run_dir / "config.yaml", run_dir / "summary.json"
    config_file.write_text(yaml.safe_dump(cfg.to_dict()))
    log_dir = Path(workdir) / "ray-logs" / run_name
    print(f"spotray demo: {steps} steps of a tiny GPT, DDP on 2 workers of a 3-node local Ray cluster; a preemption "
          f"notice near step {plan[0][1]}, a node killed near step {plan[1][1]}", file=sys.stderr, flush=True)
    with given_or_own(clusters, log_dir) as reused:
        cluster = reused.get()
        injector = FaultInjector(cluster, run_root(cfg).child("attempts"), plan).start()
        try:
            # The driver is a process of its own, as in production: Ray reads its auth settings at import.
            driver = subprocess.run(
                [sys.executable, "-m", "spotray.cli", "train", "--config", str(config_file), "--summary-json",
                 str(summary_file)],
                env={**cluster.node_env(), "RAY_ADDRESS": cluster.address}, stdout=subprocess.DEVNULL)
        finally:
            injector.stop()
    if driver.returncode != 0:
        raise TrainingFailed(f"the demo run failed (exit {driver.returncode}); Ray's node logs are in "
                             f"{cluster.log_dir}")
    summary = json.loads(summary_file.read_text())
    summary["injected"] = [i["kind"] for i in injector.injected]
    summary["loss_curve_png"] = plot_losses(summary, str(run_dir / "loss_curve.png"))
    return summary
