"""Bad inputs end with one clear error line on stderr and exit code 2 (no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.corpus import write_corpus


def spotray(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training.cli", *args], capture_output=True, text=True, timeout=120)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("spotray: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_missing_index(tmp_path):
    proc = spotray("train", "--set", f"data.path={tmp_path}/nothing")
    assert_one_line_error(proc, "no index.json", "spotray prepare")


def test_wrong_dtype_in_index(dataset_url, tmp_path):
    import shutil

    copy = tmp_path / "tokens"
    shutil.copytree(dataset_url, copy)
    index = json.loads((copy / "index.json").read_text())
    index["dtype"] = "float32"
    (copy / "index.json").write_text(json.dumps(index))
    assert_one_line_error(spotray("train", "--set", f"data.path={copy}"), "dtype")


def test_empty_corpus(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "empty.txt").write_text("")
    assert_one_line_error(spotray("prepare", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")),
                          "empty corpus")


def test_unknown_config_key(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  path: /x\ntrain:\n  max_stepz: 3\n")
    assert_one_line_error(spotray("train", "--config", str(config)), "train.max_stepz", "unknown key", "max_steps")


def test_world_size_larger_than_global_batch(dataset_url):
    proc = spotray("train", "--set", f"data.path={dataset_url}", "--set", "scaling.num_workers=16",
                   "--set", "train.global_batch_size=8")
    assert_one_line_error(proc, "scaling.num_workers", "global_batch_size")


@pytest.mark.parametrize("pair,needle", [("train.lr=fast", "train.lr"), ("parallel=tp", "parallel"),
                                         ("noequals", "key=value"), ("model.preset=gpt5", "model.preset")])
def test_bad_overrides(pair, needle, dataset_url):
    assert_one_line_error(spotray("train", "--set", f"data.path={dataset_url}", "--set", pair), needle)


def test_prepare_then_train_from_the_command_line(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", documents=8)
    prep = spotray("prepare", "--input", corpus, "--output", str(tmp_path / "data"))
    assert prep.returncode == 0, prep.stderr
    summary_path = tmp_path / "summary.json"
    proc = spotray("train", "--set", f"data.path={tmp_path}/data", "--set", f"checkpoint.path={tmp_path}/ckpt",
                   "--set", "train.max_steps=6", "--set", "checkpoint.every_steps=3", "--set", "train.seq_len=32",
                   "--set", "scaling.num_workers=1", "--summary-json", str(summary_path),
                   "--audit-dir", str(tmp_path / "audit"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["final_step"] == 6 and summary["samples_consumed"] == 6 * 8
    assert len(summary["param_sha256"]) == 64 and summary["tokens_per_s"] > 0
    assert len(summary["checkpoints"]) == 2 and summary["audit"]["exactly_once"]
