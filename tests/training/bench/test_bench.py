"""Every ``spotray bench`` command at its smallest size: the JSON that BENCHMARKS.md is made from has its keys, and
its ratios are finite and positive. How fast anything is, the benches measure; these only show that they run."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from tests.training.runs import cli_env

SPOTRAY = Path(sys.executable).parent / "spotray"


def bench(*args: str, model: str = "tiny", ray_address: str | None = None) -> dict:
    """``ray_address``: a bench that trains through ``spotray train`` joins the session's Ray there rather than
    starting one (what it runs is the same either way)."""
    with tempfile.TemporaryDirectory() as tmp:  # where the bench's own folder goes, and is gone from when it ends
        env = cli_env(TMPDIR=tmp, **({"RAY_ADDRESS": ray_address} if ray_address else {}))
        proc = subprocess.run([str(SPOTRAY), "bench", *args, "--preset", "tiny", "--json"], capture_output=True,
                              text=True, timeout=900, env=env)
        left = [path.name for path in Path(tmp).glob("spotray-bench-*")]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not left, "a bench leaves no folder behind"
    result = json.loads(proc.stdout)
    assert_made_by(result, model)
    return result


def assert_made_by(result: dict, model: str) -> None:
    assert result["model"] == model and {"cpu_count", "torch", "date"} <= set(result["machine"])


def assert_ratios(result: dict, *keys: str) -> None:
    for key in keys:
        value = result[key]
        assert isinstance(value, int | float) and math.isfinite(value) and value > 0, f"{key} = {value!r}"


@pytest.mark.e2e  # a bench command on the session's Ray
def test_checkpoint_bench_on_s3(ray_address):
    result = bench("checkpoint", "--storage", "s3", "--steps", "2", ray_address=ray_address)
    assert "local" not in result and result["repeats"] == 2
    s3 = result["s3"]
    assert {"checkpoint_mb", "sync_blocked_s", "async_blocked_s", "checkpoint_write_mb_s", "plain_copy_mb_s"} <= set(s3)
    assert_ratios(s3, "async_over_sync", "write_throughput_ratio", "checkpoint_mb", "sync_blocked_s")


@pytest.mark.e2e  # a bench command on the session's Ray
def test_throughput_bench_with_spotrays_snapshots_on_at_a_vocabulary_of_its_own(ray_address):
    result = bench("throughput", "--steps", "3", "--rounds", "1", "--set", "snapshot.every_steps=1", "--vocab-size",
                   "5000", ray_address=ray_address)
    assert len(result["bare_torchrun_step_s"]) == len(result["spotray_ray_step_s"]) == 1
    assert result["overrides"] == ["snapshot.every_steps=1"] and result["vocab_size"] == 5000
    assert_ratios(result, "step_time_ratio")


@pytest.mark.parametrize(("vocab_size", "dtype"), [(50257, "uint16"), (100_000, "uint32")])
def test_a_random_token_corpus_is_a_prepared_dataset_of_ids_over_its_whole_vocabulary(tmp_path, vocab_size, dtype):
    from spotray.bench.common import random_token_corpus
    from spotray.data.dataset import TokenDataset
    from spotray.data.prepare import verify

    url = random_token_corpus(str(tmp_path), vocab_size, tokens=1 << 14)
    assert verify(url)["tokens"] == 1 << 14
    dataset = TokenDataset.open(url, 127)
    assert dataset.vocab_size == vocab_size and dataset.index["dtype"] == dtype
    ids = dataset.batch(list(range(dataset.num_samples)))
    assert 0 <= int(ids.min()) < vocab_size // 100 and vocab_size * 0.99 < int(ids.max()) < vocab_size


def test_a_benchs_folder_is_removed_when_it_ends_and_kept_and_named_when_it_fails(tmp_path, monkeypatch, capsys):
    from spotray.bench.common import scratch_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with scratch_dir() as ended:
        Path(ended, "ckpt").mkdir()
    with pytest.raises(RuntimeError), scratch_dir() as failed:
        raise RuntimeError("a drill failed")
    assert [path.name for path in tmp_path.iterdir()] == [Path(failed).name]
    assert capsys.readouterr().err == f"bench: its files are kept in {failed}\n"
    with scratch_dir(str(tmp_path)) as given:
        assert given == str(tmp_path)
    assert tmp_path.is_dir()  # a caller's folder is the caller's


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs")
@pytest.mark.parametrize("which", ["throughput", "compile"])
def test_a_gpu_bench_refuses_more_workers_than_the_machine_has_gpus_before_starting_anything(which, capsys):
    from spotray.cli import main

    assert main(["bench", which, "--gpu", "--workers", "2", "--json"]) == 2
    assert "--gpu with --workers 2: this machine has" in capsys.readouterr().err


@pytest.mark.parametrize("vocab_size", ["1", "0", str((1 << 32) + 1)])
def test_the_throughput_bench_refuses_a_vocabulary_it_cannot_train_on_before_starting_anything(vocab_size, capsys):
    from spotray.cli import main

    assert main(["bench", "throughput", "--vocab-size", vocab_size, "--json"]) == 2
    assert f"--vocab-size {vocab_size}: give a vocabulary of 2 to 2**32 tokens" in capsys.readouterr().err


def test_a_failed_bare_loop_is_reported_by_a_ranks_own_error_line_and_not_run_again(tmp_path, monkeypatch):
    from spotray.bench import throughput
    from spotray.errors import SpotrayError

    runs = []
    run = throughput._run_bare

    def counted(cfg):
        runs.append(cfg)
        return run(cfg)

    monkeypatch.setattr(throughput, "_run_bare", counted)
    cfg = throughput._config(str(tmp_path / "no-data"), str(tmp_path), steps=2, name="bare", preset="tiny", workers=2)
    with pytest.raises(SpotrayError, match=r"bare torchrun loop failed \(exit 1\): .*DataError: no index\.json at"):
        throughput._bare_step_s(cfg)
    assert len(runs) == 1  # the same error again would say nothing new


# What torchrun's stderr held where CI's bare loop aborted, up to the rank's own lines (its banner followed).
ABORTED = """terminate called after throwing an instance of 'gloo::IoException'
  what():  [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:11148
E1206 05:58:02.664000 20766 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) local_rank: 0
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


@pytest.mark.parametrize("aborts", [1, 2])
def test_a_bare_loop_whose_rank_aborted_runs_once_more_saying_why(tmp_path, monkeypatch, capsys, aborts):
    from spotray.bench import throughput
    from spotray.errors import SpotrayError

    outcomes = [subprocess.CompletedProcess([], 1, "", ABORTED)] * aborts + [
        subprocess.CompletedProcess([], 0, '{"step_s": 0.25}\n', "")]
    monkeypatch.setattr(throughput, "_run_bare", lambda cfg: outcomes.pop(0))
    cfg = throughput._config(str(tmp_path), str(tmp_path), steps=2, name="bare", preset="tiny", workers=2)
    what = "what():  [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:11148"
    if aborts == 1:
        assert throughput._bare_step_s(cfg) == 0.25
        assert f"bench: a rank of the bare torchrun loop aborted ({what}): running it once more" in \
            capsys.readouterr().err
    else:
        with pytest.raises(SpotrayError, match=re.escape(what)):
            throughput._bare_step_s(cfg)


@pytest.mark.e2e  # a bench command on the session's Ray
def test_throughput_bench_of_a_transformers_model(ray_address):
    llama = '{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, ' \
            '"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320, "max_position_embeddings": 256}'
    result = bench("throughput", "--steps", "3", "--rounds", "1", "--hf-config", llama, model="hf:llama",
                   ray_address=ray_address)
    assert_ratios(result, "step_time_ratio")


@pytest.mark.e2e  # a bench command on bare process groups, no Ray
def test_pretrained_bench_reads_about_half_the_model_on_each_of_2_ranks():
    result = bench("pretrained")
    assert all(0.4 < share <= 0.6 for share in result["bytes_read_per_rank_over_model"])
    assert_ratios(result, "from_pretrained_local_one_rank_s", "model_mb")


@pytest.mark.e2e  # a bench command on bare process groups, no Ray
def test_export_bench():
    result = bench("export")
    assert_ratios(result, "export_s", "peak_rss_over_model", "export_rss_growth_over_model")


@pytest.mark.e2e  # a bench command on the session's Ray
def test_compile_bench_times_a_replacement_that_takes_its_graphs_from_the_kept_caches():
    result = bench("compile", "--rounds", "1", "--workers", "1")
    assert result["graphs_from_cache"][0] >= 2  # a forward and a backward at least
    assert_ratios(result, "replacement_over_cold", "replacement_over_cold_median")
    assert all(seconds > 0 for seconds in result["cold_s"] + result["replacement_s"])


def test_prepare_bench_tokenizes_the_same_tokens_as_the_datasets_baseline(ray_address):
    proc = subprocess.run([str(SPOTRAY), "bench", "prepare", "--size-mb", "8", "--rounds", "1", "--json"],
                          capture_output=True, text=True, timeout=900, env=cli_env(RAY_ADDRESS=ray_address))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    cases = {(c["format"], c["storage"], c["tokenizer"]): c for c in result["cases"]}
    assert set(cases) == {("jsonl", "local", "bytes"), ("jsonl", "s3", "bytes"), ("parquet", "local", "bytes"),
                          ("parquet", "s3", "bytes"), ("jsonl", "local", "hf-bpe")}
    for case in cases.values():
        assert_ratios(case, "scaling", "scaling_median")
        assert case["peak_task_rss_mb"] is None or case["peak_task_rss_mb"] > 0  # None: no sample saw a task
        assert case["tokens"] == result["datasets_baseline"][case["tokenizer"]]["tokens"]  # the same data
    assert result["corpus_mb"]["hf-bpe"] < result["corpus_mb"]["bytes"]  # one file of four
    assert_ratios(result["spotray_over_datasets"], "bytes", "hf-bpe")
    assert_ratios(result["spotray_over_datasets_median"], "bytes", "hf-bpe")


@pytest.mark.parametrize(("argv", "error"), [
    (["recovery", "--script", "--fault", "notice"], "--fault notice is not measured for a script"),
    (["recovery", "--script", "--storage", "local,s3"], "give --storage s3"),
    (["checkpoint", "--script"], "--script: only with `bench recovery`"),
    (["recovery", "--script", "--capacity-gap", "-1"], "--capacity-gap -1: give 0 or more seconds"),
])
def test_the_script_recovery_bench_refuses_what_it_does_not_measure_before_starting_anything(argv, error, capsys):
    from spotray.cli import main

    assert main(["bench", *argv, "--json"]) == 2  # a SpotrayError: one line, no traceback
    assert error in capsys.readouterr().err


@pytest.mark.cluster  # a bench command: it starts its own Ray
def test_recovery_bench_of_a_trainer_script_against_rays_integration():
    # 50-step intervals: the tiny model must not finish its 300 steps before the drill's kill lands. A 2 s gap: the
    # figure's meaning needs Ray to have noticed the loss before the replacement starts, a smoke test does not.
    result = bench("recovery", "--script", "--rounds", "1", "--steps", "50", "--capacity-gap", "2")
    assert result["capacity_gap_s"] == 2
    s3 = result["s3"]
    for side in ("baseline", "spotray"):
        (drill,) = s3[side]
        assert drill["resumed_from"] >= 50 and drill["resumed_from"] % 50 == 0  # from a checkpoint
        assert_ratios(drill, "recovery_s", "ray_s", "worker_s")
        assert len(drill["bytes_read_per_node"]) == 2 and min(drill["bytes_read_per_node"].values()) >= 0
    assert_ratios(s3, "recovery_ratio", "recovery_ratio_median", "worker_ratio")


@pytest.mark.parametrize(("argv", "error"), [
    (["planner", "--kills", "x"], "--kills 'x': give counts of kills per drill"),
    (["planner", "--kills", "1,2"], "--kills 1,2: give counts of 1 or more, one of them 3 or more"),
    (["planner", "--steps", "300"], "--steps 300 is too few for 4 kills: give at least 551"),
    (["goodput", "--faults", "notice"], "--faults notice: give demo (the demo's notice and kill) or kill"),
    (["goodput", "--faults", "kill", "--kills", "x"], "--kills 'x': give one whole number"),
    (["goodput", "--faults", "kill", "--kills", "0"], "--kills 0: give 1 or more"),
    (["goodput", "--faults", "kill", "--steps", "300"], "--steps 300 is too few for 4 kills: give at least 551"),
    (["soak", "--faults", "many"], "--faults 'many': give one whole number")])
def test_the_fault_schedule_benches_refuse_bad_arguments_before_starting_anything(argv, error, capsys):
    from spotray.cli import main

    assert main(["bench", *argv, "--json"]) == 2
    assert error in capsys.readouterr().err


def test_the_planner_benchs_kills_are_spread_apart_and_differ_between_repeats():
    from spotray.bench.planner import GAP_STEPS, TAIL_STEPS, spread_kills

    first, second = spread_kills(4, 1800, seed=0), spread_kills(4, 1800, seed=1)
    for plan in (first, second):
        steps = [step for kind, step in plan]
        assert {kind for kind, _ in plan} == {"kill"} and len(steps) == 4
        assert all(b - a >= GAP_STEPS for a, b in zip(steps, steps[1:], strict=False))
        assert steps[-1] < 1800 - TAIL_STEPS
    assert first != second
