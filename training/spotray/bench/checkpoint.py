"""``spotray bench checkpoint``: what a save costs training, and how fast sharded saves write.

On 2 Ray workers with a model whose parameters + AdamW state exceed 100 MB, per storage (local dir and S3):
- training time blocked per save, sync vs async (``dcp.async_save`` returns after staging to memory);
- sharded write throughput (bytes of the checkpoint / sync save time) vs each rank writing the same number of
  bytes as one plain file to the same storage at the same time.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from spotray import config
from spotray.bench.common import bench_corpus, machine, read_result, scratch_dir, write_result
from spotray.checkpoints.dcp import Checkpointer
from spotray.drills.s3local import create_bucket, moto_server
from spotray.errors import SpotrayError, root_cause
from spotray.ray_local import join_or_start
from spotray.storage import resolve
from spotray.worker.attempt import WorkerEnv, run_root
from spotray.worker.loop import build_parts

_CHUNK = 8 << 20


def _bench_config(data_url: str, storage_url: str, endpoint: str | None, preset: str) -> config.TrainConfig:
    return config.load(None, [
        f"data.path={data_url}", f"checkpoint.path={storage_url}", "run.name=bench",
        f"model.preset={preset}", "train.seq_len=64", "train.global_batch_size=4", "scaling.num_workers=2",
        "checkpoint.keep_last=1",
        *([f"storage.endpoint_url={endpoint}"] if endpoint else []),
    ])


def _worker(loop_config: dict) -> None:
    cfg = config.from_dict(loop_config["train"])
    repeats = loop_config["repeats"]
    context = ray.train.get_context()
    env = WorkerEnv(context.get_world_rank(), context.get_world_size(), ray.train.torch.get_device(),
                    lambda metrics: None)
    t = build_parts(cfg, env)
    for _ in range(2):  # populate AdamW state so the checkpoint has its real size
        t.step(t.dataset.batch(t.sampler.next_batch(env.rank, env.world_size)))
    root = run_root(cfg)
    result: dict[str, Any] = {}  # the JSON result document
    train_between_s = 0.0
    for mode in ("sync", "async"):
        ckpt = Checkpointer(root.child(mode), rank=env.rank, world_size=env.world_size, keep_last=1,
                            async_save=mode == "async")
        blocked = []
        for i in range(repeats):
            dist.barrier()
            started = time.perf_counter()
            ckpt.save(i + 1, t.state)
            blocked.append(time.perf_counter() - started)
            _train_for(t, env, train_between_s)
        started = time.perf_counter()
        ckpt.wait()
        result[mode] = {"blocked_s": blocked, "final_wait_s": time.perf_counter() - started}
        # A real checkpoint interval is much longer than a save: give the async saves that much room.
        train_between_s = 2 * max(blocked)
    ckpt_dir = root.child("sync", "checkpoints", f"step_{repeats:09d}")
    sizes = {n: ckpt_dir.child(n).size() for n in ckpt_dir.list_names() if n.endswith(".distcp")}
    mine = sum(size for name, size in sizes.items() if name.startswith(f"__{env.rank}_"))
    result["checkpoint_bytes"] = sum(sizes.values())
    result["plain_copy_s"] = min(_plain_copy(root.child("plain", f"rank{env.rank}.bin"), mine) for _ in range(repeats))
    result["sync_save_s"] = min(result["sync"]["blocked_s"])
    if env.rank == 0:
        write_result(resolve(loop_config["result_url"]), result)


def _train_for(t, env: WorkerEnv, seconds: float) -> None:
    """At least two steps and ``seconds`` of training; every rank runs the same number of steps."""
    deadline = time.perf_counter() + seconds
    steps = 0
    while True:
        t.step(t.dataset.batch(t.sampler.next_batch(env.rank, env.world_size)))
        steps += 1
        more = torch.tensor(int(steps < 2 or time.perf_counter() < deadline))
        dist.all_reduce(more, op=dist.ReduceOp.MIN)
        if not more.item():
            return


def _plain_copy(target, nbytes: int) -> float:
    """Write ``nbytes`` of distinct in-memory data as one file (a save also streams distinct tensor memory)."""
    payload = memoryview(os.urandom(nbytes))
    dist.barrier()
    started = time.perf_counter()
    with target.open_output() as out:
        for offset in range(0, nbytes, _CHUNK):
            out.write(payload[offset : offset + _CHUNK])
    dist.barrier()
    return time.perf_counter() - started


def _measure(data_url: str, storage_url: str, endpoint: str | None, workdir: str, repeats: int, preset: str) -> dict:
    cfg = _bench_config(data_url, storage_url, endpoint, preset)
    result_url = resolve(workdir).child(f"result-{time.time_ns()}.json").url
    trainer = TorchTrainer(
        _worker,
        train_loop_config={"train": cfg.to_dict(), "repeats": repeats, "result_url": result_url},
        scaling_config=ScalingConfig(num_workers=2),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name="bench", storage_path=resolve(workdir).child("ray").path),
    )
    try:
        trainer.fit()
    except Exception as exc:
        raise SpotrayError(f"checkpoint benchmark on {storage_url} failed: {root_cause(exc)}") from exc
    raw = read_result(resolve(result_url))
    sync_blocked = sorted(raw["sync"]["blocked_s"])[len(raw["sync"]["blocked_s"]) // 2]
    async_blocked = sorted(raw["async"]["blocked_s"])[len(raw["async"]["blocked_s"]) // 2]
    ckpt_mb = raw["checkpoint_bytes"] / 1e6
    return {
        "checkpoint_mb": round(ckpt_mb, 1),
        "sync_blocked_s": round(sync_blocked, 3),
        "async_blocked_s": round(async_blocked, 3),
        "async_over_sync": round(async_blocked / sync_blocked, 3),
        "checkpoint_write_mb_s": round(ckpt_mb / raw["sync_save_s"], 1),
        "plain_copy_mb_s": round(ckpt_mb / raw["plain_copy_s"], 1),
        "write_throughput_ratio": round(raw["plain_copy_s"] / raw["sync_save_s"], 3),
        "raw": raw,
    }


def run(storages: list[str], s3_endpoint: str | None = None, repeats: int = 3, preset: str = "small") -> dict:
    with scratch_dir() as workdir:
        data_url = bench_corpus(workdir)
        results = {"machine": machine(), "workers": 2, "model": preset, "repeats": repeats}
        with contextlib.ExitStack() as stack:
            endpoint = None
            if "s3" in storages:  # the server starts before Ray, so the workers inherit its credentials
                endpoint = s3_endpoint or stack.enter_context(moto_server())
            join_or_start(max(os.cpu_count() or 1, 3), log_to_driver=False)
            if "local" in storages:
                local = resolve(workdir).child("ckpt").url
                results["local"] = _measure(data_url, local, None, workdir, repeats, preset)
            if endpoint:
                s3 = _measure(data_url, f"{create_bucket(endpoint)}/ckpt", endpoint, workdir, repeats, preset)
                results["s3"] = s3 | {"endpoint": s3_endpoint or "moto server on 127.0.0.1"}
        return results
