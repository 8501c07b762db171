"""In-memory snapshot drills on a real multi-node Ray cluster: a node killed without notice takes its holder (and
the snapshot files in it) with it; the next attempt restores the newest snapshot from the surviving node."""

from __future__ import annotations

import json
import time

import pytest

from spotray import config
from spotray.accounts import goodput
from spotray.drills.process_group import train_on_process_group
from spotray.storage import resolve
from tests.drills.test_preemption import drill_settings, run_drill

pytestmark = pytest.mark.cluster

SNAPSHOT_EVERY = 3


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_kill_resumes_from_the_survivors_snapshot_bitwise_reading_no_checkpoint(cluster, dataset_url, tmp_path,
                                                                                   parallel):
    """DDP or FSDP (each rank's part its own) on 2 workers on 2 nodes, a snapshot every 3 steps and a checkpoint
    every 20: a node is killed a few steps past a checkpoint. The next attempt restores the snapshot, newer than
    every checkpoint, whose killed node's part only the survivor's ring copy still holds. It loses at most two
    intervals (the newest snapshot may still be copying), spends its restore time on the snapshot (none on storage),
    and ends bitwise equal to an uninterrupted run, every sample trained once."""
    def kill_after_a_few_more_steps(node):
        time.sleep(0.8)  # a few snapshots past the checkpoint, before the next checkpoint
        cluster.kill(node)

    first_last, second_from = run_drill(cluster, dataset_url, tmp_path, kill_after_a_few_more_steps, "kill",
                                        f"snapshot.every_steps={SNAPSHOT_EVERY}", f"parallel={parallel}")
    assert second_from % 20 != 0, "resumed from a checkpoint, not from the newer snapshot"
    assert 0 <= first_last - second_from <= 2 * SNAPSHOT_EVERY, (first_last, second_from)
    attempts = resolve(f"{tmp_path}/ckpt").child("drill", "attempts")
    second = goodput.attempt_records(attempts)[1]
    assert second.status_of("snapshot_restore_s") > 0 and second.status_of("restore_s") == 0
    held = second.status_of("snapshot", None)  # what `spotray status` and the gauges show
    assert held["step"] > second_from and len(held["nodes"]) == 2, held
    assert all(0 < node["bytes"] < node["cap"] for node in held["nodes"].values()), held
    straight = train_on_process_group(config.load(None, [*drill_settings(dataset_url, str(tmp_path / "straight")),
                                                         f"parallel={parallel}"]).to_dict(), 2)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["param_sha256"] == straight["param_sha256"]
