"""``spotray bench soak``: its seeded schedule, and a short soak (every fault kind once) on a real multi-node local Ray
cluster."""

import json
import subprocess
import sys
import threading

import pytest

from spotray.bench.soak import HELD_AT_MOST, KINDS, LOST_AT_MOST, _Driver, _wait_for_resumed, schedule, soak_checks
from spotray.errors import SpotrayError


def test_the_schedule_has_every_kind_at_least_once_and_is_the_same_for_a_seed():
    for seed in range(20):
        kinds = schedule(seed, 10)
        assert len(kinds) == 10 and set(kinds) == set(KINDS)
        assert kinds == schedule(seed, 10)
    assert len({tuple(schedule(seed, 12)) for seed in range(20)}) > 1


LOSSES = {str(step): 1.0 for step in range(1, 101)}
RUN = {"final_step": 100, "param_sha256": "a", "audit": {"exactly_once": True}, "losses": LOSSES}
SAVES = {"failed": [60], "committed": [80, 90, 100]}  # a save failed in the outage; those kept at the end


def test_each_check_fails_on_what_it_guards():
    events = [{"kind": "kill", "lost_steps": 10, "lost_steps_at_most": 11, "recovery_s": 30.0, "resumed_from": 80,
               "from_snapshot": True}]
    faults = [{"kind": "kill", "injected_s": 0.1}, {"kind": "outage", "injected_s": 5.0, "committed_during": [50],
                                                     "whole_during": [50]}]
    good = soak_checks(RUN, {"param_sha256": "a"}, events, faults, [(1, 100.0, 20), (1, 120.0, 30)], 4, 100, SAVES)
    assert all(good.values())
    assert not soak_checks(RUN, {"param_sha256": "b"}, events, faults, [], 4, 100, SAVES)[
        "bitwise_equal_to_uninterrupted"]
    over = [{**events[0], "lost_steps": LOST_AT_MOST["kill"] + 1}]
    assert not soak_checks(RUN, {"param_sha256": "a"}, over, faults, [], 4, 100, SAVES)["lost_steps_within_bounds"]
    grown = [(1, 100.0, 20), (1, 400.0, 20)]
    assert not soak_checks(RUN, {"param_sha256": "a"}, events, faults, grown, 4, 100, SAVES)[
        "driver_memory_and_files_bounded"]
    assert not soak_checks(RUN, {"param_sha256": "a"}, events, faults, [], HELD_AT_MOST + 1, 100, SAVES)[
        "storage_within_retention"]
    assert not soak_checks(RUN, {"param_sha256": "a"}, [], faults, [], 4, 100, SAVES)["status_agrees"]
    unknown = [{**events[0], "kind": "unknown"}]
    assert not soak_checks(RUN, {"param_sha256": "a"}, unknown, faults, [], 4, 100, SAVES)["endings_from_evidence"]
    notice = [{"kind": "notice", "injected_s": 0.1}]
    from_storage = [{**events[0], "kind": "notice", "lost_steps": 0, "from_snapshot": False}]
    assert not soak_checks(RUN, {"param_sha256": "a"}, from_storage, notice, [], 4, 100, SAVES)[
        "notices_resumed_from_their_snapshot"]
    assert all(soak_checks(RUN, {"param_sha256": "a"}, [{**events[0], "from_snapshot": False}], faults, [], 4, 100,
                           SAVES).values())  # a checkpoint newer than the newest snapshot may commit as a node goes
    corrupt = [{"kind": "corrupt", "injected_s": 0.1, "corrupted_step": 90}]
    before = [{**events[0], "resumed_from": 80, "from_snapshot": False}]
    assert all(soak_checks(RUN, {"param_sha256": "a"}, before, corrupt, [], 4, 100, SAVES).values())
    checks = soak_checks(RUN, {"param_sha256": "a"}, [{**before[0], "resumed_from": 90}], corrupt, [], 4, 100, SAVES)
    assert not checks["corrupted_checkpoint_never_resumed"]
    outlived = [{**before[0], "from_snapshot": True}]  # both nodes went, and their snapshots with them
    assert not soak_checks(RUN, {"param_sha256": "a"}, outlived, corrupt, [], 4, 100, SAVES)[
        "no_snapshot_outlived_its_copies"]
    assert not soak_checks(RUN, {"param_sha256": "a"}, events, faults, [], 4, 100, {**SAVES, "committed": [80, 90]})[
        "finished"]
    gap = {**RUN, "losses": {step: loss for step, loss in LOSSES.items() if step != "37"}}
    assert not soak_checks(gap, {"param_sha256": "a"}, events, faults, [], 4, 100, SAVES)["loss_log_complete"]


def test_saves_must_fail_in_an_outage_what_it_lists_as_committed_be_whole_and_none_be_kept_unless_trained_again():
    events = [{"kind": "kill", "lost_steps": 10, "lost_steps_at_most": 11, "recovery_s": 30.0, "resumed_from": 80,
               "from_snapshot": True}]

    def held(failed: list[int], committed_during: list[int], committed: list[int],
             whole: list[int] | None = None) -> bool:
        faults = [{"kind": "kill", "injected_s": 0.1},
                  {"kind": "outage", "injected_s": 5.0, "committed_during": committed_during,
                   "whole_during": committed_during if whole is None else whole}]
        saves = {"failed": failed, "committed": committed}
        return soak_checks(RUN, {"param_sha256": "a"}, events, faults, [], 4, 100, saves)[
            "outage_saves_failed_and_never_adopted"]

    assert held([60], [50], [80, 90, 100])
    assert not held([], [50], [80, 90, 100])  # the outage failed no save: it did not test anything
    assert held([60], [50, 60], [80, 90, 100])  # its commit marker landed though the reply was lost: it is whole
    assert not held([60], [50, 60], [80, 90, 100], whole=[50])  # listed as committed while a file was missing
    assert not held([70], [50], [70, 90, 100])  # committed later, and no restart trained step 70 again
    assert held([90], [50], [80, 90, 100])  # saved again after the restart from step 80 trained it again


def test_a_lost_heads_driver_must_end_in_one_line_naming_the_step_it_resumes_from():
    line = ("spotray: error: training run 'soak' lost its Ray cluster (its head stopped answering); run the same "
            "command again, on a new cluster if need be, to resume from step 40 (the full log: /runs/soak/train.log)")
    head = {"kind": "head", "injected_s": 20.0, "exit": 1, "errors": [line], "traceback": False}
    resumed = {"kind": "kill", "lost_steps": 5, "lost_steps_at_most": 6, "recovery_s": 30.0, "resumed_from": 40,
               "from_snapshot": False}

    def said(**changed) -> bool:
        return soak_checks(RUN, {"param_sha256": "a"}, [resumed], [{**head, **changed}], [], 4, 100, SAVES)[
            "head_loss_said_in_one_line"]

    assert said()
    assert not said(exit=0)
    assert not said(traceback=True)
    assert not said(errors=[line, line])
    assert not said(errors=[line.replace("'soak'", "'other'")])
    assert not said(errors=[line.replace("step 40", "step 45")])  # not a checkpoint's step
    assert not said(errors=[line.split(" (the full log")[0]])


def test_a_fault_waits_until_the_run_has_resumed_after_each_fault_before_it(tmp_path):
    driver = _Driver(None, [], tmp_path)  # type: ignore[arg-type]  # no cluster: only its log and process are read
    driver.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    log = tmp_path / "driver.log"
    log.write_text("spotray: RESUMED from step 40 on 2 workers, 27.3s after the interruption, 0 steps lost\n")
    _wait_for_resumed(driver, 1)
    resumed_again = "spotray: RESUMED from step 60 on 2 workers\n"
    threading.Timer(1.0, lambda: log.write_text(log.read_text() + resumed_again)).start()
    _wait_for_resumed(driver, 2, timeout_s=30)
    assert log.read_text().count("RESUMED") == 2  # it waited for the second
    driver.proc.kill()
    with pytest.raises(SpotrayError, match="resumed 2 times, not once after each of the 3 faults"):
        _wait_for_resumed(driver, 3)


@pytest.mark.cluster
def test_a_run_survives_a_seeded_schedule_of_every_fault_bitwise_and_exactly_once(reused_clusters):
    from spotray.bench.soak import run

    # Every kind once, the least training between them; on the drills' cluster, which a head loss replaces.
    result = run(minutes=1, seed=1, faults=len(KINDS), clusters=reused_clusters)
    assert result["passed"], json.dumps({k: v for k, v in result.items() if k != "machine"})
    assert result["survived_by_kind"] == dict.fromkeys(KINDS, 1)
