"""``spotray bench pretrained``: a pretrained start on 2 FSDP ranks from (loopback) S3, against ``from_pretrained``
on one process from a local copy of the same files: bytes each rank reads, and seconds."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch

from spotray import config
from spotray.bench.common import bench_corpus, machine, scratch_dir
from spotray.config import MODEL_PRESETS
from spotray.drills.process_group import run_on_process_group
from spotray.drills.s3local import create_bucket, moto_server
from spotray.storage import StorageOptions, resolve


def run(preset: str = "small", s3_endpoint: str | None = None) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    with scratch_dir() as scratch:
        workdir = Path(scratch)
        n_layer, n_head, n_embd = MODEL_PRESETS[preset]
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
            "gpt2", n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=50304, n_positions=256))
        model.save_pretrained(workdir / "model")
        model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        data_url = bench_corpus(str(workdir))
        with contextlib.ExitStack() as stack:
            endpoint = s3_endpoint or stack.enter_context(moto_server())
            url = f"{create_bucket(endpoint)}/model"
            for path in (workdir / "model").iterdir():
                resolve(f"{url}/{path.name}", StorageOptions(endpoint_url=endpoint)).put_file(str(path))
            cfg = config.load(None, [f"data.path={data_url}", f"checkpoint.path={workdir}/ckpt", "parallel=fsdp",
                                     "scaling.num_workers=2", "train.seq_len=256", f"storage.endpoint_url={endpoint}"],
                              base={"model": {"hf": {"pretrained": url}}})
            per_rank = run_on_process_group(_sharded_load, (cfg.to_dict(),), 2)
        started = time.perf_counter()
        AutoModelForCausalLM.from_pretrained(workdir / "model")
        from_pretrained_s = time.perf_counter() - started
    return {
        "machine": machine(), "model": preset, "architecture": "transformers GPT2LMHeadModel",
        "model_mb": round(model_bytes / 1e6, 1),
        "ranks": 2, "bytes_read_per_rank_over_model": [round(b / model_bytes, 3) for b, _ in per_rank],
        "fsdp_load_s": [round(s, 3) for _, s in per_rank],
        "from_pretrained_local_one_rank_s": round(from_pretrained_s, 3),
    }


def _sharded_load(rank: int, world_size: int, config_dict: dict) -> list[tuple[int, float]]:
    """Every rank's (bytes read, seconds) for loading the pretrained weights into its FSDP shards."""
    import torch.distributed as dist

    from spotray.step.parallel import parallelize
    from spotray.tasks.load import load_task

    cfg = config.from_dict(config_dict)
    task = load_task(cfg)
    with torch.device("meta"):
        model = task.build_model()
    units = task.shard_units(model)
    model.to_empty(device="cpu")
    task.on_materialized(model)
    model = parallelize(model, units, "fsdp", torch.device("cpu"), bf16=False, sync_init=False)
    started = time.perf_counter()
    read = task.load_pretrained(model)
    mine = (read, time.perf_counter() - started)
    everyone: list = [None] * world_size
    dist.all_gather_object(everyone, mine)
    return everyone

