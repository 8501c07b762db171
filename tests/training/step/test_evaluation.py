"""Validation during training: the same samples at any world size, the same value from 1 and 2 workers and from
DDP and FSDP, no effect on training, one record per evaluated step across a resume, and bad input in one line."""

from __future__ import annotations

import json
import shutil

import pytest

from infra.cli import main
from spotray.accounts import ledger
from spotray.export import ExportError, export
from spotray.step.evaluation import rank_batches, sample_ids
from spotray.worker.attempt import run_root
from tests.training.configs import make_config
from tests.training.runs import train_locally

EVAL = ("eval.every_steps=10", "eval.samples=37")  # 37: no world size here divides it, so ranks pad
# Training draws dropout masks from the RNG, so an evaluation that drew from it too would change every later step.
DROPOUT = "model.dropout=0.1"
# An evaluation that draws from the training RNG, to show that the no-effect test sees it.
RNG_IN_EVAL_TASK = """
import torch

from spotray.tasks.gpt import GPTTask


class RngInEval(GPTTask):
    def loss(self, model, batch):
        if not model.training:
            torch.rand(1)
        return super().loss(model, batch)


def make_task(cfg):
    return RngInEval(cfg)
"""


def test_sample_ids_spread_over_the_set_from_no_rng():
    assert sample_ids(100, 4) == [0, 25, 50, 75]
    assert sample_ids(10, 10) == list(range(10))


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_every_rank_runs_the_same_number_of_passes_and_each_id_is_evaluated_once(world_size):
    ids = sample_ids(1000, 37)
    per_rank = [rank_batches(ids, rank, world_size, batch=4) for rank in range(world_size)]
    assert len({len(batches) for batches in per_rank}) == 1
    evaluated = sorted(i for batches in per_rank for batch in batches for i in batch)
    assert evaluated == sorted(ids)


def eval_worker(rank: int, world_size: int, configs: list[dict]) -> list[dict]:
    """For each config: builds the seeded model, evaluates it, and checks what the evaluation left behind."""
    import torch
    from torch.distributed.tensor import DTensor

    from spotray.config import from_dict
    from spotray.step.evaluation import Evaluator, open_val_dataset
    from spotray.worker.attempt import WorkerEnv
    from spotray.worker.loop import build_parts, param_sha256

    results = []
    for config in configs:
        cfg = from_dict(config)
        env = WorkerEnv(rank, world_size, torch.device("cpu"), lambda _: None)
        parts = build_parts(cfg, env)
        before = param_sha256(parts.model)
        evaluate = Evaluator(cfg, parts.task, open_val_dataset(parts.task), rank, world_size, env.device)
        results.append({"metrics": evaluate(parts.model), "unchanged": param_sha256(parts.model) == before,
                        "sharded": all(isinstance(p, DTensor) for p in parts.model.parameters()),
                        "training": parts.model.training})
    return results


def test_one_and_two_workers_ddp_and_fsdp_report_the_same_val_loss_on_the_same_model(split_dataset_url, tmp_path):
    from spotray.drills.process_group import run_on_process_group

    def config(workers: int, parallel: str) -> dict:
        return make_config(split_dataset_url, str(tmp_path), "eval", f"scaling.num_workers={workers}",
                           f"parallel={parallel}", *EVAL).to_dict()

    [one] = eval_worker(0, 1, [config(1, "ddp")])  # in this process, without a process group
    two, fsdp = run_on_process_group(eval_worker, ([config(2, "ddp"), config(2, "fsdp")],), 2)
    assert one["unchanged"] and two["unchanged"] and fsdp["unchanged"]
    assert one["training"] and two["training"] and fsdp["training"]  # back in training mode
    assert fsdp["sharded"]  # FSDP2's parameters resharded after the forward passes
    assert set(one["metrics"]) == {"val_loss", "val_perplexity"}
    for result in (two, fsdp):
        assert result["metrics"]["val_loss"] == pytest.approx(one["metrics"]["val_loss"], rel=1e-6)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
@pytest.mark.e2e
def test_evaluation_leaves_training_bitwise_unchanged_and_a_resume_evaluates_no_step_twice(parallel,
                                                                                          split_dataset_url, tmp_path):
    on = ("checkpoint.keep_best=true", "checkpoint.keep_last=1", f"parallel={parallel}", DROPOUT, *EVAL)
    off = train_locally(make_config(split_dataset_url, str(tmp_path), "eval-off", f"parallel={parallel}", DROPOUT))
    train_locally(make_config(split_dataset_url, str(tmp_path), "eval-on", *on, "train.stop_at_step=20"))
    cfg = make_config(split_dataset_url, str(tmp_path), "eval-on", *on)
    resumed = train_locally(cfg)
    assert resumed["losses"] == off["losses"]
    assert resumed["param_sha256"] == off["param_sha256"]

    attempts = run_root(cfg).child("attempts")
    first, second = ledger.read_attempts(attempts)
    assert sorted(ledger.read_evals(attempts, first.attempt_id)) == [10, 20]
    assert sorted(ledger.read_evals(attempts, second.attempt_id)) == [30, 40]  # step 20 was not evaluated again
    assert sorted(int(s) for s in resumed["evals"]) == [10, 20, 30, 40] and resumed["time"]["seconds"]["eval"] > 0
    assert resumed["val_loss"] == resumed["evals"]["40"]["val_loss"] and off["evals"] == {} and off["val_loss"] is None

    best = min(resumed["evals"], key=lambda s: resumed["evals"][s]["val_loss"])
    assert resumed["best"]["step"] == int(best) and resumed["best"]["url"] in resumed["checkpoints"]
    assert export(f"{tmp_path}/eval-on", str(tmp_path / "best"), best=True)["step"] == int(best)
    with pytest.raises(ExportError, match="--best: no committed checkpoint of .* has a validation loss"):
        export(f"{tmp_path}/eval-off", str(tmp_path / "none"), best=True)


@pytest.mark.e2e
def test_the_no_effect_check_fails_on_an_evaluation_that_draws_from_the_training_rng(split_dataset_url, tmp_path,
                                                                                     monkeypatch):
    (tmp_path / "rng_in_eval_task.py").write_text(RNG_IN_EVAL_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned workers start with this process's sys.path
    task = ("model.task=rng_in_eval_task:make_task", DROPOUT, "train.max_steps=20")
    off = train_locally(make_config(split_dataset_url, str(tmp_path), "rng-off", *task))
    on = train_locally(make_config(split_dataset_url, str(tmp_path), "rng-on", *task, *EVAL))
    first = [str(step) for step in range(1, 11)]  # up to the first evaluation, at step 10
    assert [on["losses"][s] for s in first] == [off["losses"][s] for s in first]
    assert on["losses"]["11"] != off["losses"]["11"] and on["param_sha256"] != off["param_sha256"]


def bad_run(tmp_path, capsys, data: str, *overrides: str) -> str:
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({"data": {"path": data}, "checkpoint": {"path": str(tmp_path / "ckpt")}}))
    assert main(["train", "--config", str(config), *[a for o in overrides for a in ("--set", o)]]) == 2
    assert not (tmp_path / "ckpt").exists()  # nothing written
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_more_eval_samples_than_the_val_set_holds_is_one_line(split_dataset_url, tmp_path, capsys):
    line = bad_run(tmp_path, capsys, split_dataset_url, "eval.every_steps=10", "eval.samples=1000000")
    assert "eval.samples" in line and "lower it to at most" in line


def test_evaluation_without_a_val_set_is_one_line_that_says_what_turned_it_on_and_each_way_out(dataset_url, tmp_path,
                                                                                               capsys):
    line = bad_run(tmp_path, capsys, dataset_url, "eval.every_steps=10")
    assert "data.val_path" in line and "(eval.every_steps=10)" in line and "--val-fraction" in line
    assert "into a new --output" in line and "turn evaluation off" in line  # prepare refuses to write over a dataset
    line = bad_run(tmp_path, capsys, dataset_url, "checkpoint.keep_best=true")
    assert "(checkpoint.keep_best=true)" in line


@pytest.mark.parametrize(("field", "value", "named"), [("tokenizer", "another-tokenizer", "'another-tokenizer'"),
                                                       ("eot_token", 10, "(end-of-text id 10)")])
def test_a_val_set_of_another_tokenizer_or_end_of_text_is_one_line(split_dataset_url, tmp_path, capsys, field, value,
                                                                   named):
    other = tmp_path / "other"
    shutil.copytree(f"{split_dataset_url}/val", other)
    record = json.loads((other / "index.json").read_text())
    record[field] = value
    (other / "index.json").write_text(json.dumps(record))
    line = bad_run(tmp_path, capsys, split_dataset_url, "eval.every_steps=10", f"data.val_path={other}")
    assert "data.val_path" in line and named in line and "(end-of-text id 256)" in line
