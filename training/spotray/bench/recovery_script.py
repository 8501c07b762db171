"""``spotray bench recovery --script``: the kill drill of ``spotray bench recovery`` for a Hugging Face Trainer script.

spotray: ``spotray/examples/hf_finetune.py`` (spotray's two lines: ``SpotrayCallback`` and
``resume_from_checkpoint=spotray.hf.resume_checkpoint()``) run by ``spotray train --script``. Baseline: the same
script with Ray's own integration (``RayTrainReportCallback``, ``ray.train.get_checkpoint().as_directory()``) under
a plain ``TorchTrainer`` (``hf_ray_baseline.py``). Both save every ``--steps`` steps (the Trainer's ``save_steps``
and spotray's ``checkpoint.every_steps`` alike), keep 2 checkpoints, and put them on S3 (moto on loopback): a
GPT-2 built from ``--preset``'s shape, whose model + AdamW state is what a checkpoint holds.

The drill and its clock are ``recovery``'s: a head plus 2 worker nodes of 1 CPU (one cluster for every drill, whole
again after each); once a checkpoint is in storage (plus 1 s), a worker node is SIGKILLed; 10 s later a replacement node
starts; the clock runs from its start to the end of the first resumed step, as each job records it. Here every node also
has its own temporary directory (``$TMPDIR``), as separate machines have their own disks: a node-local restore
(spotray's default ``$TMPDIR/spotray/<run>``, Ray's ``as_directory`` temp dir) is then per node, as on a real cluster,
and not shared by all the local "nodes". Bytes read at restore are counted per node: for spotray, what the restored
directory on each node's disk records it read from storage (a node takes the files it committed itself from its own
disk); for Ray, the checkpoint directory ``as_directory`` gave each rank (one rank per node here)."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from spotray.bench.common import machine, scratch_dir
from spotray.bench.recovery import (
    CAPACITY_GAP_S,
    Fault,
    Job,
    baseline_job,
    best,
    from_the_replacement,
    interrupt,
    job_log,
    median,
    progress_file,
    spotray_job,
)
from spotray.checkpoints.script_files import RESTORED_MARK
from spotray.config import MODEL_PRESETS
from spotray.drills.cluster import LocalCluster, ReusedCluster
from spotray.drills.s3local import create_bucket, moto_server
from spotray.errors import SpotrayError
from spotray.storage import StorageOptions, resolve

STEPS_OVER_EVERY = 6  # a run's steps over its checkpoint interval: the kill lands before the first run ends
WORKERS = 2
KEEP_LAST = 2


@dataclass
class _NodeDisks(LocalCluster):
    """A local cluster whose nodes each have a temporary directory of their own (``$TMPDIR`` of the node's Ray
    processes, so of its train workers): ``disks/<node name>``."""

    disks: Path = field(kw_only=True)
    _spawning: Path | None = field(default=None, init=False, repr=False)

    def _spawn(self, name, args):
        self._spawning = self.disks / name
        self._spawning.mkdir(parents=True, exist_ok=True)
        try:
            return super()._spawn(name, args)
        finally:
            self._spawning = None

    def node_env(self) -> dict:
        # LocalCluster._spawn starts each node with node_env(): the variable reaches that node's processes alone.
        env = super().node_env()
        return {**env, "TMPDIR": str(self._spawning)} if self._spawning else env


def _script_args(preset: str, every: int) -> list[str]:
    n_layer, n_head, n_embd = MODEL_PRESETS[preset]
    return ["--max-steps", str(STEPS_OVER_EVERY * every), "--save-steps", str(every), "--n-layer", str(n_layer),
            "--n-head", str(n_head), "--n-embd", str(n_embd)]


def _spotray_job(name: str, ckpt_url: str, endpoint: str, args: list[str], every: int, script: Path,
                 cluster: LocalCluster, log: Path) -> Job:
    overrides = [f"checkpoint.path={ckpt_url}", f"run.name={name}", f"scaling.num_workers={WORKERS}",
                 f"checkpoint.every_steps={every}", f"checkpoint.keep_last={KEEP_LAST}", "train.log_every=1",
                 "env.on_nodes=true",  # the nodes inherit the storage credentials, as the RayJob's pods get them
                 f"storage.endpoint_url={endpoint}"]
    train_args = ["--script", script.name, *[arg for override in overrides for arg in ("--set", override)], "--", *args]
    root = resolve(ckpt_url, StorageOptions(endpoint_url=endpoint)).child(name)
    return spotray_job(train_args, root, ("restore",), cluster, log, cwd=script.parent)


def _spotray_bytes_read(name: str, workdir: Path) -> dict[str, int]:
    """What each node's restore read from storage, as its restored directory records it (``hf.resume_checkpoint``'s,
    under the node's ``$TMPDIR``): a node may take files it committed itself from its own disk."""
    found, disks = {}, _disks(workdir)
    for mark in sorted(disks.glob(f"*/spotray/{name}/resume/checkpoint/{RESTORED_MARK}")):
        found[mark.relative_to(disks).parts[0]] = json.loads(mark.read_text())["bytes_read"]
    return found


def _baseline_job(name: str, ckpt_url: str, endpoint: str, args: list[str], every: int, script: Path,
                  cluster: LocalCluster, log: Path) -> Job:
    job = {"name": name, "storage": f"{ckpt_url}/ray", "endpoint": endpoint, "args": args, "workers": WORKERS,
           "max_failures": 3, "keep_last": KEEP_LAST}
    return baseline_job("spotray.bench.hf_ray_baseline", job, cluster, log, phases=("restore",))


def _baseline_bytes_read(name: str, workdir: Path) -> dict[str, int]:
    """What each rank's ``as_directory`` gave it at restore, by node (one rank per node here)."""
    found: dict[str, int] = {}
    progress = progress_file(job_log(workdir, name))
    for ranks in progress.parent.glob(f"{progress.name}.rank*.jsonl"):
        for line in ranks.read_text().splitlines():
            record = json.loads(line)
            found[record["node"]] = found.get(record["node"], 0) + record["bytes"]
    return dict(sorted(found.items()))


def _disks(workdir: Path) -> Path:
    return workdir / "disks"


SIDES = {"baseline": (_baseline_job, _baseline_bytes_read), "spotray": (_spotray_job, _spotray_bytes_read)}


def _drill(side: str, name: str, ckpt_url: str, endpoint: str, args: list[str], every: int, script: Path,
           workdir: Path, clusters: ReusedCluster, capacity_gap_s: float) -> dict:
    """``recovery``'s kill drill on a whole cluster of separate node disks; the seconds from the replacement node's
    start to the end of the first resumed step (Ray's part, until the train function runs, and the worker's), and the
    bytes each node read at restore."""
    start_job, bytes_read = SIDES[side]
    ((resumed, _, back_at),) = interrupt(functools.partial(start_job, name, ckpt_url, endpoint, args, every, script),
                                         job_log(workdir, name), (Fault("kill", capacity_gap_s),), clusters)
    return {**from_the_replacement(resumed, back_at), "bytes_read_per_node": bytes_read(name, workdir)}


def run(storages: list[str], s3_endpoint: str | None = None, preset: str = "small", rounds: int = 2,
        every: int = 5, fault: str = "kill", capacity_gap_s: float = CAPACITY_GAP_S) -> dict:
    if fault != "kill":
        raise SpotrayError(f"bench recovery --script: --fault {fault} is not measured for a script; use --fault "
                           "kill (spotray's script path against Ray's own Trainer integration)")
    if storages != ["s3"]:
        raise SpotrayError("bench recovery --script: give --storage s3 (a script's checkpoints are measured on S3, "
                           "where each node downloads them; a local directory is shared by the local nodes)")
    if preset not in MODEL_PRESETS:
        raise SpotrayError(f"--preset {preset}: choose one of {', '.join(MODEL_PRESETS)}")
    if rounds < 1 or every < 1:
        raise SpotrayError("bench recovery --script: --rounds and --steps must be at least 1")
    from spotray.examples import hf_finetune

    with scratch_dir() as scratch:
        workdir = Path(scratch)
        script = workdir / "project" / "finetune.py"  # the example as a user has it: its folder is what is shipped
        script.parent.mkdir()
        shutil.copy(hf_finetune.__file__, script)
        args = _script_args(preset, every)
        result = {"machine": machine(), "model": preset, **_state_mb(preset), "workers": WORKERS,
                  "checkpoint_every_steps": every, "max_steps": STEPS_OVER_EVERY * every, "fault": fault,
                  "capacity_gap_s": capacity_gap_s, "script": "spotray/examples/hf_finetune.py",
                  "baseline_script": "spotray/bench/hf_ray_baseline.py"}
        with contextlib.ExitStack() as stack:
            endpoint = s3_endpoint or stack.enter_context(moto_server())  # before the clusters: nodes inherit its keys
            ckpt_url = f"{create_bucket(endpoint)}/ckpt"
            result["s3"] = _compare(ckpt_url, endpoint, args, every, script, workdir, rounds, capacity_gap_s)
    return result


def _compare(ckpt_url: str, endpoint: str, args: list[str], every: int, script: Path, workdir: Path,
             rounds: int, capacity_gap_s: float) -> dict:
    drills: dict[str, list[dict]] = {side: [] for side in SIDES}
    with ReusedCluster(workdir / "ray", kind=functools.partial(_NodeDisks, disks=_disks(workdir))) as clusters:
        for i in range(rounds):  # interleaved, so drift on a noisy machine hits both sides alike
            for side in SIDES:
                drills[side].append(_drill(side, f"hf-{side}-{i}", ckpt_url, endpoint, args, every, script, workdir,
                                           clusters, capacity_gap_s))
    spotray, baseline = drills["spotray"], drills["baseline"]
    return {
        **drills,
        "recovery_best_s": {side: best(found, "recovery_s") for side, found in drills.items()},
        "recovery_median_s": {side: median(found, "recovery_s") for side, found in drills.items()},
        "recovery_ratio": round(best(spotray, "recovery_s") / best(baseline, "recovery_s"), 3),
        "recovery_ratio_median": round(median(spotray, "recovery_s") / median(baseline, "recovery_s"), 3),
        "worker_ratio": round(best(spotray, "worker_s") / best(baseline, "worker_s"), 3),
        "restore_mb_per_node_median": {side: _median_mb(found) for side, found in drills.items()},
    }


def _median_mb(drills: list[dict]) -> float:
    return round(statistics.median(b for d in drills for b in d["bytes_read_per_node"].values()) / 1e6, 1) \
        if any(d["bytes_read_per_node"] for d in drills) else 0.0


def _state_mb(preset: str) -> dict:
    """The GPT-2's parameters and its model + AdamW state (two moments per parameter), in MB of float32."""
    from transformers import GPT2Config, GPT2LMHeadModel

    n_layer, n_head, n_embd = MODEL_PRESETS[preset]
    model = GPT2LMHeadModel(GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=128,
                                       n_positions=32, bos_token_id=0, eos_token_id=0))
    params = sum(p.numel() for p in model.parameters())
    return {"params_m": round(params / 1e6, 2), "model_optimizer_mb": round(3 * 4 * params / 1e6, 1)}
