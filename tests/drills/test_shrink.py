"""Going on with the survivors, in their own processes, on a real local Ray cluster of a head and 3 worker nodes: a
node killed with no replacement shrinks the run at once to the 2 workers left; a node that joins later grows it back
to 3 at a committed step (under DDP, and under FSDP, where every rank restores its own part at the new size); a run
whose lost worker is never replaced still ends. A notice moves the run off its node with no step lost. Two nodes lost
at once: the one left goes on, alone in a new fit where Ray Train fails to replace them, and grows with each node
that joins. Nodes of two workers each (a RayJob's multi-GPU pods) shrink and grow by whole nodes. Every sample is
trained once; a run that shrinks is not bitwise equal to an uninterrupted one."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from spotray.accounts import goodput
from spotray.drills.cluster import LocalCluster
from spotray.storage import resolve
from tests.drills.test_preemption import (
    attempts_and_last_steps,
    finish,
    start_training,
    wait_for_checkpoint,
    wait_until,
)
from tests.drills.test_snapshots import past_the_checkpoint

pytestmark = pytest.mark.cluster

STEPS = 300
KILLS_STEPS = 450  # room to grow back before the end, on a loaded machine
GROW_TWICE_STEPS = 1000  # room for two node joins: 174 steps on 2 workers (9 s) once ran out before the second


def kill_and_grow_back(cluster: LocalCluster, tmp_path, driver: subprocess.Popen, shrunk: int, whole: int) -> Path:
    """Past a snapshot newer than the checkpoint of step 20, the newest node killed: until the run shrinks to
    ``shrunk`` workers, then, on a node added, grows back to ``whole``. The driver's log."""
    log = tmp_path / "driver.log"
    wait_for_checkpoint(tmp_path, 20, driver)
    past_the_checkpoint(tmp_path)
    cluster.kill(cluster.nodes[-1])
    wait_until(lambda: f"SHRUNK to {shrunk} workers" in log.read_text(), "the run shrinking", tmp_path, driver)
    cluster.add_node()
    wait_until(lambda: f"GREW to {whole} workers" in log.read_text(), "the run growing back", tmp_path, driver)
    return log


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_kill_without_a_replacement_shrinks_the_run_at_once_and_a_new_node_grows_it_back(three_workers, dataset_url,
                                                                                        tmp_path, parallel):
    cluster = three_workers
    driver = start_training(dataset_url, tmp_path, cluster, f"parallel={parallel}", "scaling.num_workers=3",
                            "scaling.min_workers=2", "scaling.grow_after_s=3", "snapshot.every_steps=3",
                            f"train.max_steps={KILLS_STEPS}")
    log = kill_and_grow_back(cluster, tmp_path, driver, 2, 3)
    cluster.kill(cluster.nodes[-1])  # the newcomer's, right after it joined; no node replaces it
    wait_until(lambda: log.read_text().count("SHRUNK to 2 workers") == 2, "the run shrinking again", tmp_path,
               driver)
    summary = finish(driver, tmp_path)
    assert summary["final_step"] == KILLS_STEPS and summary["audit"]["exactly_once"], summary["audit"]
    attempts = goodput.attempt_records(resolve(f"{tmp_path}/ckpt").child("drill", "attempts"))
    assert [a.info.world_size for a in attempts] == [3, 2, 3, 2]
    assert [a.ending.kind for a in attempts[:3]] == ["kill", "resize", "kill"]
    assert "FAILURE" not in log.read_text()  # e.g. a rank restored another's part: a loss that is not finite
    (first_last, _), (shrunk_from, shrunk_last), (grown_from, _), _ = attempts_and_last_steps(tmp_path)
    assert shrunk_from % 20 != 0 and first_last - shrunk_from <= 6  # from a snapshot of the 3 workers
    assert grown_from == shrunk_last  # growing loses no step
    assert summary["spot_interruptions"] == 2, summary  # the resize is none


def test_a_notice_moves_the_run_to_the_others_at_once_losing_no_step(three_workers, dataset_url, tmp_path):
    cluster = three_workers
    driver = start_training(dataset_url, tmp_path, cluster, "scaling.num_workers=3", "scaling.min_workers=2",
                            "snapshot.every_steps=3", f"train.max_steps={STEPS}")
    wait_for_checkpoint(tmp_path, 20, driver)
    past_the_checkpoint(tmp_path)
    cluster.preempt_with_notice(cluster.nodes[-1])
    summary = finish(driver, tmp_path)
    assert summary["final_step"] == STEPS and summary["audit"]["exactly_once"], summary["audit"]
    attempts = goodput.attempt_records(resolve(f"{tmp_path}/ckpt").child("drill", "attempts"))
    assert [a.info.world_size for a in attempts] == [3, 2] and attempts[0].ending.kind == "notice"
    (_, noticed_last), (moved_from, _) = attempts_and_last_steps(tmp_path)
    assert moved_from == noticed_last and summary["lost_steps"] == 0, summary["events"]
    assert attempts[1].status_of("snapshot_restore_s") > 0 and attempts[1].status_of("restore_s") == 0



def test_two_nodes_lost_at_once_leave_one_worker_that_trains_alone_where_ray_cannot_replace_them_then_grows_by_node(
        three_workers, dataset_url, tmp_path):
    """Ray Train replaces a lost worker alone, and its controller fails where another of the group is lost too: the
    driver starts a new fit with the one worker that fits, which grows with each node that joins (capacity often comes
    back a node at a time), to the whole group."""
    cluster = three_workers
    driver = start_training(dataset_url, tmp_path, cluster, "scaling.num_workers=3", "scaling.min_workers=1",
                            "scaling.grow_after_s=3", "snapshot.every_steps=3", f"train.max_steps={GROW_TWICE_STEPS}")
    log = tmp_path / "driver.log"
    wait_for_checkpoint(tmp_path, 20, driver)
    past_the_checkpoint(tmp_path)
    for node in [node for node in cluster.nodes[1:] if node.alive][-2:]:  # earlier drills' dead nodes stay listed
        cluster.kill(node)
    again = "starting the workers again from the run's newest state, 1 of 3 workers"
    wait_until(lambda: again in log.read_text(), "Ray Train's failed replacement, and a new fit of 1 worker", tmp_path,
               driver)
    since, attempts = time.time(), resolve(f"{tmp_path}/ckpt").child("drill", "attempts")
    wait_until(lambda: any(a.info.world_size == 1 and a.info.started_at >= since and a.status_of("first_step_at")
                           for a in goodput.attempt_records(attempts)), "the worker left training alone", tmp_path,
               driver)
    cluster.add_node()
    wait_until(lambda: "GREW to 2 workers" in log.read_text(), "the run growing onto the node that joined", tmp_path,
               driver)
    cluster.add_node()
    summary = finish(driver, tmp_path)
    assert summary["final_step"] == GROW_TWICE_STEPS and summary["audit"]["exactly_once"], summary["audit"]
    assert log.read_text().count("starting the workers again") == 1 and "GREW to 3 workers" in log.read_text()
    sizes_and_endings = [(a.info.world_size, a.ending.kind) for a in goodput.attempt_records(attempts)]
    assert sizes_and_endings[0] == (3, "kill"), sizes_and_endings
    assert sizes_and_endings[-3:] == [(1, "resize"), (2, "resize"), (3, "finished")], sizes_and_endings
    # The survivor's attempt in the failed fit, where it recorded itself: it lost no node, and no budget pays for it.
    assert set(sizes_and_endings[1:-3]) <= {(1, "restarted")}, sizes_and_endings
    (_, alone_last), (grown_from, grown_last), (whole_from, _) = attempts_and_last_steps(tmp_path)[-3:]
    assert grown_from == alone_last and whole_from == grown_last  # growing loses no step
    assert summary["spot_interruptions"] == 1, summary  # the two nodes' loss ended one attempt
    assert summary["cost"]["nodes_interrupted"] == 2, summary["cost"]  # and is two of the pool's, for its rate


def test_nodes_of_two_workers_shrink_by_a_whole_node_from_its_neighbours_snapshot_copies_and_grow_back(
        reused_clusters, dataset_url, tmp_path):
    """A multi-GPU pod runs a worker per GPU, and losing it loses them all: under FSDP the run goes on with the other
    node's two workers, from the lost node's parts that the ring copied onto the survivor, and grows back by a node."""
    reused_clusters.discard()  # nodes of 2 CPUs; the next drill gets the shared cluster again
    with LocalCluster(tmp_path / "ray-logs", cpus_per_node=2).start(workers=2) as cluster:
        driver = start_training(dataset_url, tmp_path, cluster, "parallel=fsdp", "scaling.num_workers=4",
                                "scaling.min_workers=2", "scaling.workers_per_node=2", "scaling.grow_after_s=3",
                                "snapshot.every_steps=3", f"train.max_steps={KILLS_STEPS}")
        log = kill_and_grow_back(cluster, tmp_path, driver, 2, 4)
        summary = finish(driver, tmp_path)
    assert summary["final_step"] == KILLS_STEPS and summary["audit"]["exactly_once"], summary["audit"]
    attempts = goodput.attempt_records(resolve(f"{tmp_path}/ckpt").child("drill", "attempts"))
    sizes_and_endings = [(a.info.world_size, a.ending.kind) for a in attempts]
    assert sizes_and_endings[0] == (4, "kill") and sizes_and_endings[-2:] == [(2, "resize"), (4, "finished")]
    # Two workers lost at once: where Ray Train fails to replace them, the driver's new fit of the two that fit
    # follows the survivors' attempt (docs/training.md), which then reads `restarted`.
    assert set(sizes_and_endings[1:-2]) <= {(2, "restarted")}, sizes_and_endings
    assert "FAILURE" not in log.read_text()
    steps = attempts_and_last_steps(tmp_path)
    (first_last, _), (shrunk_from, _) = steps[:2]
    assert shrunk_from % 20 != 0 and first_last - shrunk_from <= 6  # from the snapshot, the lost node's parts too
    assert attempts[1].status_of("snapshot_restore_s") > 0 and attempts[1].status_of("restore_s") == 0
    (_, shrunk_last), (grown_from, _) = steps[-2:]
    assert grown_from == shrunk_last  # growing loses no step
