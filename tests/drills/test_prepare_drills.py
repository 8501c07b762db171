"""Drills for ``spotray prepare`` on real Ray: a worker node lost mid-run, and the whole prepare SIGKILLed and run
again. Either way the dataset is byte-identical to one prepared without faults."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotray.bench.prepare import train_bpe, write_corpus
from spotray.data.prepare import prepare
from tests.training.data.test_prepare import PrepareFields, dataset_digests

SPOTRAY = Path(sys.executable).parent / "spotray"
SETTINGS: PrepareFields = {"chunk_mb": 1.0, "shard_tokens": 1 << 16}

pytestmark = pytest.mark.cluster  # a real multi-node local Ray cluster (make quick leaves these out)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """24 MB of JSONL and a BPE tokenizer (slow enough per chunk to fault mid-run), and its reference dataset."""
    root = tmp_path_factory.mktemp("prepare-drill")
    write_corpus(str(root / "in"), 24, files=2)
    tokenizer = train_bpe(str(root / "in" / "part-00.jsonl"), str(root / "bpe"))
    prepare(str(root / "in"), str(root / "reference"), tokenizer=tokenizer, **SETTINGS)
    return root, tokenizer


def command(root: Path, tokenizer: str, out: Path) -> list[str]:
    return [str(SPOTRAY), "prepare", "--input", str(root / "in"), "--output", str(out), "--tokenizer", tokenizer,
            "--chunk-mb", str(SETTINGS["chunk_mb"]), "--shard-tokens", str(SETTINGS["shard_tokens"])]


def wait_for_chunks(out: Path, count: int, proc: subprocess.Popen, timeout_s: float = 120) -> int:
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        done = len(list(out.glob("chunks/*/manifest.json")))
        if done >= count:
            return done
        time.sleep(0.1)
    raise AssertionError(f"prepare did not finish {count} chunks while running: {proc.poll()=}")


def test_a_worker_node_lost_mid_prepare_costs_only_its_chunks(cluster, corpus, tmp_path):
    root, tokenizer = corpus
    out = tmp_path / "out"
    env = {**cluster.node_env(), "RAY_ADDRESS": cluster.address}
    proc = subprocess.Popen(command(root, tokenizer, out), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    done = wait_for_chunks(out, 3, proc)
    cluster.kill(next(node for node in cluster.nodes[1:] if node.alive))  # the older of the two worker nodes
    cluster.add_node(wait=False)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert done < len(list((root / "reference").glob("chunks/*/manifest.json")))
    assert dataset_digests(str(out)) == dataset_digests(str(root / "reference"))
    assert "prepared" in stdout


def test_a_killed_prepare_run_again_does_only_the_missing_chunks(corpus, tmp_path):
    root, tokenizer = corpus
    out = tmp_path / "out"
    proc = subprocess.Popen(command(root, tokenizer, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    done = wait_for_chunks(out, 4, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local Ray it started, with every task mid-write
    proc.wait(timeout=30)
    assert not (out / "index.json").exists()

    again = subprocess.run(command(root, tokenizer, out), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    total = len(list((root / "reference").glob("chunks/*/manifest.json")))
    assert done < total
    resumed = re.search(r"prepare: (\d+) of (\d+) chunks were done by an earlier run", again.stderr)
    assert resumed and done <= int(resumed[1]) < int(resumed[2]) == total, again.stderr[-2000:]
    assert dataset_digests(str(out)) == dataset_digests(str(root / "reference"))
