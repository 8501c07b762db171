"""``spotray bench tracking``: what the experiment trackers cost training. The step time of ``spotray train`` with
all three trackers on (MLflow to a loopback server started here, W&B offline, TensorBoard) over the step time with
none, in interleaved rounds; and none over none (an A/A pair), for the noise of the machine."""

from __future__ import annotations

from pathlib import Path

from spotray import config
from spotray.bench.common import bench_corpus, machine, scratch_dir
from spotray.drills.mlflowlocal import mlflow_server
from spotray.driver import launch

VARIANTS = ("none", "tracked", "none_again")  # run in this order in every round
LOG_EVERY = 10


def _config(data_url: str, workdir: str, steps: int, name: str, preset: str, workers: int,
            trackers: list[str]) -> config.TrainConfig:
    return config.load(None, [
        f"data.path={data_url}", f"checkpoint.path={workdir}/ckpt", f"run.name={name}", f"model.preset={preset}",
        "train.seq_len=256", f"train.global_batch_size={4 * workers}", f"train.max_steps={steps}",
        f"train.log_every={LOG_EVERY}", f"checkpoint.every_steps={steps}", f"scaling.num_workers={workers}",
        *trackers])


def _trackers(workdir: str, mlflow_url: str) -> list[str]:
    return [f"tracking.mlflow.uri={mlflow_url}", "tracking.wandb.project=spotray-bench",
            "tracking.wandb.mode=offline", f"tracking.tensorboard.dir={workdir}/tensorboard"]


def run(steps: int = 60, rounds: int = 2, preset: str = "small", workers: int = 2) -> dict:
    with scratch_dir() as workdir:
        data_url = bench_corpus(workdir)
        step_s: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        gaps = []
        with mlflow_server(Path(workdir) / "mlflow") as server:
            for i in range(rounds):  # interleaved, so drift on a noisy machine hits every variant alike
                for variant in VARIANTS:
                    trackers = _trackers(workdir, server.url) if variant == "tracked" else []
                    cfg = _config(data_url, workdir, steps, f"{variant}-{i}", preset, workers, trackers)
                    summary = launch.run(cfg)
                    step_s[variant].append(cfg.train.global_batch_size * cfg.train.seq_len / summary["tokens_per_s"])
                    gaps += summary["tracking_gaps"]
    best = {variant: min(seconds) for variant, seconds in step_s.items()}
    return {"machine": machine(), "model": preset, "workers": workers, "steps": steps, "rounds": rounds,
            "step_s": {variant: [round(s, 4) for s in seconds] for variant, seconds in step_s.items()},
            "tracked_over_none": round(best["tracked"] / best["none"], 3),
            "none_over_none": round(best["none_again"] / best["none"], 3), "tracking_gaps": gaps}
