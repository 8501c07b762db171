"""The baseline of ``spotray bench recovery --script``: the Trainer script of ``spotray/examples/hf_finetune.py``
(same model, arguments, data and ``TrainingArguments``) with Ray's own integration in place of spotray's two lines,
as Ray's documentation writes it::

    trainer = Trainer(..., callbacks=[RayTrainReportCallback()])
    checkpoint = ray.train.get_checkpoint()
    with checkpoint.as_directory() as d:
        trainer.train(resume_from_checkpoint=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))

launched by a plain ``TorchTrainer`` with ``RunConfig(storage_path=s3://..., storage_filesystem=<pyarrow S3>)`` and
``FailureConfig(max_failures=...)``. ``RayTrainReportCallback`` copies every rank's newest ``checkpoint-N`` into a
Ray checkpoint on each save (the upload blocks training) and every rank downloads the whole checkpoint at restore.

What the bench reads back, written beside ``job["progress"]`` (a path every local node sees): rank 0's
attempts (resumed-from step, train function entered, first step ended) and whether a checkpoint is in storage; and
each rank's restore (its node's temp dir, bytes of the checkpoint directory Ray fetched, seconds).

Run as ``python -m spotray.bench.hf_ray_baseline '<json>'`` against the cluster at RAY_ADDRESS."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import ray
import ray.train
import torch
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from spotray.storage import StorageOptions, resolve


def script_args(argv: list[str]) -> argparse.Namespace:
    """``hf_finetune.py``'s arguments (the bench passes both sides the same)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--output-dir", default="out")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=64)
    return parser.parse_args(argv)


def train_fn(job: dict) -> None:
    entered_at = time.time()
    # Imported here, as spotray's worker imports them when it runs the script: Ray's part of the clock (until the
    # train function runs) is then Ray's alone on both sides, and the worker's part the script's work.
    from ray.train.huggingface.transformers import RayTrainReportCallback
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from spotray.examples.hf_finetune import token_dataset

    args = script_args(job["args"])
    rank = ray.train.get_context().get_world_rank()
    # The node's own disk: a relative output_dir would be the driver's folder, which all local nodes share.
    output_dir = os.path.join(tempfile.gettempdir(), "hf-ray", job["name"], args.output_dir)
    model = GPT2LMHeadModel(GPT2Config(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, vocab_size=128,
                                       n_positions=32, bos_token_id=0, eos_token_id=0))
    training_args = TrainingArguments(output_dir=output_dir, max_steps=args.max_steps, save_steps=args.save_steps,
                                      per_device_train_batch_size=4, learning_rate=3e-3, logging_steps=5,
                                      report_to="none", use_cpu=not torch.cuda.is_available(), seed=0)
    progress = _progress_callback(job["progress"], entered_at)
    trainer = Trainer(model=model, args=training_args, train_dataset=token_dataset(512, 32, 128),
                      callbacks=[RayTrainReportCallback(), progress])  # Ray: 1 of 2
    checkpoint = ray.train.get_checkpoint()  # Ray: 2 of 2, with the three lines below
    if checkpoint is None:
        trainer.train()
    else:
        started = time.time()
        with checkpoint.as_directory() as directory:
            progress.restore_s = time.time() - started
            _record_restore(job["progress"], rank, directory, progress.restore_s)
            trainer.train(resume_from_checkpoint=os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME))
    trainer.save_model(f"{output_dir}/final")


def _progress_callback(path: str, entered_at: float):
    """Rank 0's attempts and checkpoints, for the bench; after ``RayTrainReportCallback`` in the list, so that a
    save it records is in storage."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        restore_s = 0.0
        first = True

        def on_step_end(self, args, state, control, **kwargs):
            if self.first and state.is_world_process_zero:
                _update(path, lambda p: p["attempts"].append(
                    [state.global_step - 1, entered_at, time.time(), self.restore_s]))
            self.first = False

        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                _update(path, lambda p: p.update(checkpointed=state.global_step))

    return Progress()


def _record_restore(path: str, rank: int, directory: str, seconds: float) -> None:
    """What this rank's ``as_directory`` fetched: the bytes of the directory (the whole checkpoint, downloaded
    unless another process of this node already had), in its own file."""
    nbytes = sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file() and not p.name.startswith("."))
    record = {"rank": rank, "node": Path(tempfile.gettempdir()).name, "bytes": nbytes, "restore_s": seconds,
              "at": time.time()}
    with open(f"{path}.rank{rank}.jsonl", "a") as out:
        out.write(json.dumps(record) + "\n")


def _update(path: str, change) -> None:
    file = Path(path)
    current = json.loads(file.read_text()) if file.exists() else {"attempts": []}
    change(current)
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(current))
    tmp.replace(file)


def main(job: dict) -> None:
    storage = resolve(job["storage"], StorageOptions(endpoint_url=job.get("endpoint")))
    ray.init()
    TorchTrainer(
        train_fn, train_loop_config=job,
        scaling_config=ScalingConfig(num_workers=job["workers"]),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name=job["name"], storage_path=storage.path, storage_filesystem=storage.fs,
                             failure_config=FailureConfig(max_failures=job["max_failures"]),
                             checkpoint_config=CheckpointConfig(num_to_keep=job["keep_last"])),
    ).fit()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
