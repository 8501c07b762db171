"""Commit markers, integrity checks and retention (single process: DCP without a process group)."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import re
import shutil
import time

import pytest
import torch

from spotray.checkpoints import dcp
from spotray.checkpoints.dcp import (
    COMMIT_MARKER,
    Checkpointer,
    RestorePrefetch,
    best_checkpoint,
    list_committed,
    list_set_aside,
)
from spotray.drills.outage import OutageProxy
from spotray.drills.s3local import create_bucket
from spotray.errors import CheckpointError, StorageError
from spotray.storage import StorageOptions, resolve


class Box:
    """A minimal Stateful holding one tensor."""

    def __init__(self, value: float):
        self.tensor = torch.full((64, 64), value)

    def state_dict(self) -> dict:
        return {"t": self.tensor}

    def load_state_dict(self, state: dict) -> None:
        self.tensor = state["t"]


@pytest.fixture
def run_root(storage_root):
    return storage_root


def save_steps(root, steps, keep_last=10, async_save=False):
    ckpt = Checkpointer(root, keep_last=keep_last, async_save=async_save, rank=0, world_size=1)
    for step in steps:
        ckpt.save(step, {"box": Box(float(step))})
    ckpt.close()
    return ckpt


def restore(root, ckpt: Checkpointer | None = None) -> tuple[int | None, float]:
    box = Box(-1.0)
    ckpt = ckpt or Checkpointer(root, keep_last=10, async_save=False, rank=0, world_size=1)
    candidates = ckpt.committed()
    prefetch = RestorePrefetch(candidates[0]) if candidates else None  # read ahead, verified all the same
    restored = ckpt.restore_latest({"box": box}, prefetch=prefetch, candidates=candidates)
    return (restored.step if restored else None), float(box.tensor[0, 0])


def damage(location, how: str = "flip") -> None:
    data = bytearray(location.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    location.write_bytes(bytes(data))


@pytest.mark.parametrize("async_save", [False, True])
def test_restore_returns_the_newest_committed_state(run_root, async_save):
    save_steps(run_root, [10, 20], async_save=async_save)
    assert restore(run_root) == (20, 20.0)
    marker = json.loads(run_root.child("checkpoints", "step_000000020", COMMIT_MARKER).read_text())
    assert marker["step"] == 20 and marker["world_size"] == 1
    assert set(marker["files"]) == {".metadata", "__0_0.distcp"}


def test_partial_save_without_marker_is_skipped_with_a_warning(run_root, caplog):
    save_steps(run_root, [10, 20])
    run_root.child("checkpoints", "step_000000020", COMMIT_MARKER).delete_file()
    with caplog.at_level(logging.WARNING):
        assert restore(run_root) == (10, 10.0)
    assert "step_000000020" in caplog.text and "partial" in caplog.text


@pytest.mark.parametrize("victim", ["__0_0.distcp", ".metadata"])
@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_corrupted_checkpoint_is_skipped_and_the_previous_one_used(run_root, victim, how, caplog):
    save_steps(run_root, [10, 20])
    target = run_root.child("checkpoints", "step_000000020", victim)
    damage(target, how)
    with caplog.at_level(logging.WARNING):
        assert restore(run_root) == (10, 10.0)
    [warning] = [r.getMessage() for r in caplog.records
                 if r.levelno == logging.WARNING and r.name == "spotray.checkpoints.dcp"]
    assert warning.startswith(f"checkpoint step 20 cannot be read ({target.url} is corrupted: ")
    # The error's own message: what differs, found against recorded, never a line of source code.
    found_and_recorded = {("__0_0.distcp", "flip"): r"item box\.t \(bytes 0-16384\) has CRC32 \w{8}, \.metadata "
                                                     r"records CRC32 \w{8}\)",
                          (".metadata", "flip"): r"CRC32 \w{8}, COMMITTED\.json records \w{8}\)",
                          ("__0_0.distcp", "truncate"): r"8192 bytes, COMMITTED\.json records 16384\)",
                          (".metadata", "truncate"): r"\d+ bytes, COMMITTED\.json records \d+\)"}
    assert re.search(found_and_recorded[(victim, how)], warning), warning
    assert "raise" not in warning and "Traceback" not in warning


def test_an_unreadable_checkpoint_is_set_aside_whole_and_a_new_save_of_its_step_lands_beside_it(run_root):
    save_steps(run_root, [10, 20])
    ckpts = run_root.child("checkpoints")
    shard = ckpts.child("step_000000020", "__0_0.distcp")
    damage(shard)
    damaged_bytes = shard.read_bytes()
    ckpt = Checkpointer(run_root, keep_last=1, rank=0, world_size=1, attempt_id="a2")
    assert restore(run_root, ckpt) == (10, 10.0)
    [record] = list_set_aside(run_root)
    assert record["url"] == ckpts.child("set-aside", "step_000000020.a2").url
    assert (record["step"], record["resumed_from"], record["set_aside_by"]) == (20, 10, "a2")
    assert "is corrupted: item box.t" in record["reason"]
    ckpt.save(14, {"box": Box(14.5)})
    ckpt.save(20, {"box": Box(20.5)})  # the lineage's own step 20
    ckpt.close()
    assert [c.step for c in list_committed(ckpts)] == [20]
    assert restore(run_root) == (20, 20.5)
    aside = ckpts.child("set-aside", "step_000000020.a2")
    assert aside.child("__0_0.distcp").read_bytes() == damaged_bytes
    assert json.loads(aside.child(COMMIT_MARKER).read_text())["step"] == 20


def test_retention_counts_only_the_lineage_and_never_deletes_a_checkpoint_it_did_not_write(tmp_path):
    run_root = resolve(str(tmp_path / "run"))
    save_steps(run_root, [10])
    ckpt = Checkpointer(run_root, keep_last=1, rank=0, world_size=1)
    assert restore(run_root, ckpt) == (10, 10.0)
    ckpts = tmp_path / "run" / "checkpoints"
    shutil.copytree(ckpts / "step_000000010", ckpts / "step_000000030")  # committed above it by someone else
    (ckpts / "step_000000020").mkdir()
    (ckpts / "step_000000020" / "__0_0.distcp").write_bytes(b"partial")  # above this attempt's newest, below 30
    ckpt.save(14, {"box": Box(14.0)})
    ckpt.close()
    assert [c.step for c in list_committed(run_root.child("checkpoints"))] == [30, 14]
    assert (ckpts / "step_000000020").exists()  # 30 is not this lineage's newest: nothing below it is garbage yet


def test_a_checkpoint_with_a_damaged_commit_marker_is_set_aside_not_deleted(run_root):
    save_steps(run_root, [10, 20])
    run_root.child("checkpoints", "step_000000020", COMMIT_MARKER).write_text('{"step": 2')
    assert restore(run_root) == (10, 10.0)
    [record] = list_set_aside(run_root)
    assert record["step"] == 20 and "COMMITTED.json is damaged" in record["reason"]


def test_a_checkpoint_missing_a_shard_is_set_aside_as_unreadable(run_root):
    save_steps(run_root, [10, 20])
    run_root.child("checkpoints", "step_000000020", "__0_0.distcp").delete_file()
    assert restore(run_root) == (10, 10.0)
    [record] = list_set_aside(run_root)
    assert record["step"] == 20 and record["reason"].endswith("__0_0.distcp: not found")


def test_a_checkpoint_that_cannot_be_set_aside_stops_the_attempt_and_stays_where_it_is(tmp_path):
    run_root = resolve(str(tmp_path / "run"))
    save_steps(run_root, [10, 20])
    damage(run_root.child("checkpoints", "step_000000020", "__0_0.distcp"))
    (tmp_path / "run" / "checkpoints" / "set-aside").write_text("a file where the directory goes")
    with pytest.raises(CheckpointError, match=r"checkpoint step 20 could not be set aside .*: the attempt stops"):
        restore(run_root)
    assert run_root.child("checkpoints", "step_000000020", COMMIT_MARKER).exists()


def test_all_checkpoints_unreadable_is_an_error_not_a_silent_restart(run_root):
    save_steps(run_root, [10])
    target = run_root.child("checkpoints", "step_000000010", "__0_0.distcp")
    target.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        restore(run_root)


def test_checkpoints_unreadable_for_one_reason_name_it_once(run_root):
    """A resume at another train.seq_len: every checkpoint's sampler refuses the same way."""
    save_steps(run_root, [10, 20, 30])
    ckpt = Checkpointer(run_root, keep_last=10, async_save=False, rank=0, world_size=1)
    why = {10: "a damaged shard", 20: "trained on 49 samples", 30: "trained on 49 samples"}
    with pytest.raises(CheckpointError, match=r"\(steps 30, 20: trained on 49 samples; step 10: a damaged shard\): "):
        ckpt.restore_first(ckpt.committed(), lambda c: why[c.step])


def test_fresh_run_restores_nothing(run_root):
    assert restore(run_root) == (None, -1.0)


@pytest.mark.parametrize("async_save", [False, True])
def test_retention_keeps_last_n_committed_and_drops_older_partials(run_root, async_save):
    ckpts = run_root.child("checkpoints")
    save_steps(run_root, [10])
    ckpts.child("step_000000015", "__0_0.distcp").write_bytes(b"partial")  # a crashed save
    save_steps(run_root, [20, 30, 40], keep_last=2, async_save=async_save)
    assert [c.step for c in list_committed(ckpts)] == [40, 30]
    assert ckpts.list_names() == ["step_000000030", "step_000000040"]


def test_storage_holds_at_most_keep_last_when_a_save_starts_however_slow_retention_is(tmp_path, monkeypatch):
    """The next save waits for the last commit's retention, and removes what a failed save left."""
    run_root = resolve(str(tmp_path / "run"))
    apply_retention, save = dcp.Checkpointer._apply_retention, dcp.dcp.save
    held = []

    def slow_retention(self, newest):
        time.sleep(0.3)
        apply_retention(self, newest)

    def counting_save(state, storage_writer, **kwargs):
        held.append(sorted(n for n in run_root.child("checkpoints").list_names() if n.startswith("step_")))
        if storage_writer.location.url.endswith("step_000000035"):  # a save that fails halfway, leaving its folder
            storage_writer.location.child("__0_0.distcp").write_bytes(b"partial")
            raise OSError("storage went away")
        return save(state, storage_writer=storage_writer, **kwargs)

    monkeypatch.setattr(dcp.Checkpointer, "_apply_retention", slow_retention)
    monkeypatch.setattr(dcp.dcp, "save", counting_save)
    ckpt = Checkpointer(run_root, keep_last=2, rank=0, world_size=1)
    for step in (10, 20, 30, 35, 40, 50):
        ckpt.save(step, {"box": Box(float(step))})
    ckpt.close()
    assert max(len(folders) for folders in held) == 2, held
    assert "step_000000035" not in held[-1]


def _retention_fails_in(outage: dict, monkeypatch) -> None:
    """Retention fails while ``outage["on"]``, from the commit of step 30 on: the retention of 20 may still be running
    in its thread when a test cuts storage off."""
    apply_retention = dcp.Checkpointer._apply_retention

    def retention(self, newest):
        if outage["on"] and newest >= 30:
            raise StorageError("cannot list: storage went away")
        apply_retention(self, newest)

    monkeypatch.setattr(dcp.Checkpointer, "_apply_retention", retention)


def test_a_retention_that_failed_in_an_outage_is_done_before_the_next_save_writes(tmp_path, monkeypatch):
    """Old checkpoints it could not delete would otherwise stay beside the new save until the next commit."""
    run_root = resolve(str(tmp_path / "run"))
    save, held, outage = dcp.dcp.save, [], {"on": False}

    def counting_save(state, storage_writer, **kwargs):
        held.append(sorted(n for n in run_root.child("checkpoints").list_names() if n.startswith("step_")))
        return save(state, storage_writer=storage_writer, **kwargs)

    _retention_fails_in(outage, monkeypatch)
    monkeypatch.setattr(dcp.dcp, "save", counting_save)
    ckpt = Checkpointer(run_root, keep_last=2, rank=0, world_size=1)
    for step in (10, 20):
        ckpt.save(step, {"box": Box(float(step))})
    outage["on"] = True  # the commit of 30 lands, its retention does not
    ckpt.save(30, {"box": Box(30.0)})
    ckpt.wait()
    outage["on"] = False
    ckpt.save(40, {"box": Box(40.0)})
    ckpt.close()
    assert held[-1] == ["step_000000020", "step_000000030"], held  # 10 went before 40 was written


def test_a_save_while_retention_still_cannot_delete_fails_without_writing_and_the_retry_tidies_first(tmp_path,
                                                                                                     monkeypatch):
    """Writing beside what retention could not delete would hold keep_last + 2 folders (the soak saw 5 of 4)."""
    run_root = resolve(str(tmp_path / "run"))
    write_data, held, outage = dcp._CommittingWriter.write_data, [], {"on": False}

    def counting_write(self, plan, planner):
        held.append(sorted(n for n in run_root.child("checkpoints").list_names() if n.startswith("step_")))
        return write_data(self, plan, planner)

    _retention_fails_in(outage, monkeypatch)
    monkeypatch.setattr(dcp._CommittingWriter, "write_data", counting_write)
    ckpt = Checkpointer(run_root, keep_last=2, rank=0, world_size=1)
    for step in (10, 20):
        ckpt.save(step, {"box": Box(float(step))})
    outage["on"] = True  # 30 commits, its retention fails, and so does the next save's
    ckpt.save(30, {"box": Box(30.0)})
    assert ckpt.save(40, {"box": Box(40.0)}) is None and ckpt.failed_saves == 1
    assert not run_root.child("checkpoints", "step_000000040").exists()
    outage["on"] = False
    saved = ckpt.save(41, {"box": Box(41.0)})
    assert saved is not None and saved.step == 41
    ckpt.close()
    # keep_last and the one being written, at every write; 10 went before 41 was written
    assert max(len(folders) for folders in held) == 3, held
    assert held[-1] == ["step_000000020", "step_000000030", "step_000000041"], held


@pytest.fixture
def outage(s3_server):
    with OutageProxy(s3_server) as proxy:
        yield proxy


@pytest.mark.parametrize("async_save", [False, True])
def test_failed_save_during_an_outage_is_retried_and_never_resumed_from(outage, s3_server, async_save, caplog):
    bucket = create_bucket(s3_server)
    root = resolve(f"{bucket}/run", StorageOptions(endpoint_url=outage.endpoint))
    ckpt = Checkpointer(root, keep_last=10, async_save=async_save, rank=0, world_size=1, failure_budget_s=600)
    ckpt.save(10, {"box": Box(10.0)}, blocking=True)
    outage.cut()
    with caplog.at_level(logging.WARNING):
        ckpt.save(20, {"box": Box(20.0)})
        ckpt.wait()  # async: the failure surfaces here, at a point every rank reaches alike
    assert ckpt.failed_saves == 1 and "training continues" in caplog.text
    assert ckpt.retry_due(21)
    outage.restore()
    assert restore(root) == (10, 10.0), "the failed save must never be resumed from"
    saved = ckpt.ensure_saved(21, {"box": Box(21.0)})
    assert saved is not None and saved.step == 21
    ckpt.close()
    assert not ckpt.retry_due(22) and restore(root) == (21, 21.0)


def test_exhausted_failure_budget_stops_the_run_naming_the_setting(tmp_path):
    (tmp_path / "not-a-dir").write_text("a file where the run's directory should be")
    ckpt = Checkpointer(resolve(str(tmp_path / "not-a-dir" / "run")), keep_last=10, rank=0, world_size=1,
                        failure_budget_s=0)
    with pytest.raises(CheckpointError, match=r"failed for 0s \(1 in a row, last at step 10: .*"
                                              r"save_failure_budget_s=0 is used up: fix access to"):
        ckpt.save(10, {"box": Box(1.0)})


def test_a_checkpoint_that_storage_cannot_serve_now_is_neither_skipped_nor_set_aside(outage, s3_server):
    root = resolve(f"{create_bucket(s3_server)}/run", StorageOptions(endpoint_url=outage.endpoint))
    save_steps(root, [10, 20])
    ckpt = Checkpointer(root, keep_last=10, rank=0, world_size=1)
    candidates = ckpt.committed()
    outage.cut()
    with pytest.raises(CheckpointError, match=r"^checkpoint step 20 could not be restored \(.+\); nothing was "
                                              r"skipped or set aside, and a restart tries it again$"):
        ckpt.restore_latest({"box": Box(-1.0)}, candidates=candidates)
    outage.restore()
    assert list_set_aside(root) == [] and restore(root) == (20, 20.0)


def test_keep_best_keeps_the_lowest_val_loss_beyond_keep_last_and_an_emergency_save_is_never_best(run_root):
    ckpt = Checkpointer(run_root, keep_last=1, keep_best=True, rank=0, world_size=1)
    for step, val_loss in ((10, 3.0), (20, 2.0), (30, 2.5)):
        ckpt.save(step, {"box": Box(float(step))}, val_loss=val_loss)
    ckpt.ensure_saved(35, {"box": Box(35.0)})  # a notice's emergency checkpoint: not evaluated
    ckpt.close()
    kept = list_committed(run_root.child("checkpoints"))
    assert [(c.step, c.val_loss) for c in kept] == [(35, None), (20, 2.0)]
    best = best_checkpoint(kept)
    assert best is not None and best.step == 20


def test_without_keep_best_retention_is_keep_last_alone(run_root):
    ckpt = Checkpointer(run_root, keep_last=1, rank=0, world_size=1)
    for step, val_loss in ((10, 1.0), (20, 2.0)):
        ckpt.save(step, {"box": Box(float(step))}, val_loss=val_loss)
    ckpt.close()
    assert [c.step for c in list_committed(run_root.child("checkpoints"))] == [20]


def test_an_abandoned_checkpointer_waits_for_nothing_in_flight(run_root):
    waited = []

    class GroupGone(concurrent.futures.Future):  # a save whose process group is gone: it would never end
        def result(self, timeout=None):
            waited.append(self)

    ckpt = Checkpointer(run_root, keep_last=1, async_save=True, rank=0, world_size=1)
    ckpt._pending = (5, GroupGone())
    ckpt.abandon()
    assert ckpt.wait() is None and waited == []
