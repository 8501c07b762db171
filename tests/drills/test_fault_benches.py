"""The benches whose runs are fault drills (``spotray bench recovery``, ``goodput``, ``planner``) at their smallest
size, as ``tests/training/bench/test_bench.py`` runs the others: their JSON has its keys and its figures are in range.
Here they run in this process on the drills' shared cluster, and the goodput and planner benches on the demo's corpus,
which the demo's drill prepared: starting a cluster and preparing the corpus cost more than a drill's training."""

from __future__ import annotations

import pytest

from tests.training.bench.test_bench import assert_made_by, assert_ratios


@pytest.mark.cluster
def test_recovery_bench_on_local_storage_against_ray_and_from_a_notice_against_a_kill(reused_clusters):
    from spotray.bench.recovery import run

    # 100-step intervals: the tiny model must not finish its steps before the drill's faults land. A 2 s capacity gap,
    # as in the script bench's smoke test.
    result = run(["local"], preset="tiny", rounds=1, every=100, fault="both", clusters=reused_clusters,
                 capacity_gap_s=2)
    assert_made_by(result, "tiny")
    assert result["capacity_gap_s"] == 2
    local = result["local"]
    for side in ("baseline", "spotray"):
        (drill,) = local[side]
        assert drill["resumed_from"] >= 100 and drill["resumed_from"] % 100 == 0  # from a checkpoint
        assert_ratios(drill, "recovery_s", "ray_s", "worker_s")
    assert_ratios(local, "recovery_ratio", "recovery_ratio_median", "worker_ratio")
    (notice,), (kill,) = local["notice"], local["kill"]
    # In spotray's run, after the kill compared with the baseline's: the notice, which saved where it landed, past the
    # periodic checkpoint it followed; then the kill, which went back to the periodic checkpoint after that.
    assert notice["resumed_from"] > local["spotray"][0]["resumed_from"] + 100
    assert kill["resumed_from"] % 100 == 0 and kill["resumed_from"] > notice["resumed_from"]
    for timed in (notice, kill):  # from the fault, split like the comparison's
        assert_ratios(timed, "recovery_s", "ray_s", "worker_s")
    assert local["notice_minus_kill_s"] == round(notice["recovery_s"] - kill["recovery_s"], 2)


@pytest.mark.cluster
def test_goodput_bench_reports_both_variants_with_their_badput(reused_clusters, demo_workdir):
    from spotray.bench.goodput import run

    result = run(steps=300, rounds=1, clusters=reused_clusters, workdir=demo_workdir)
    assert_made_by(result, "tiny")
    (baseline,), (spotray,) = result["baseline"], result["spotray"]
    for drill in (baseline, spotray):
        assert [e["kind"] for e in drill["events"]] == ["notice", "kill"] == drill["injected"]
        assert 0 < drill["goodput"] < 1 and drill["seconds"]["productive"] > 0
    # It did not wait for the draining node. The notice's own recovery, not the run's waiting: the kill's recovery
    # is in that too, and it varies by ten seconds on a loaded machine (a CI run: 44.0 s against 42.3 s).
    notice_s = [drill["events"][0]["recovery_s"] for drill in (spotray, baseline)]
    assert notice_s[0] < notice_s[1], notice_s
    assert result["goodput_gain"] == round(result["goodput_best"]["spotray"] - result["goodput_best"]["baseline"], 4)


@pytest.mark.cluster
def test_goodput_bench_on_a_schedule_of_kills_with_snapshots_and_shrinking_against_without(reused_clusters,
                                                                                          demo_workdir):
    from spotray.bench.goodput import run

    result = run(steps=300, rounds=1, clusters=reused_clusters, workdir=demo_workdir, faults="kill", kills=1,
                 capacity_gap_s=2)
    assert_made_by(result, "tiny")
    assert result["capacity_gap_s"] == 2 and len(result["kills_at_steps"]) == 1
    (off,), (on,) = result["off"], result["on"]
    for drill in (off, on):
        assert [e["kind"] for e in drill["events"] if e["kind"] != "resize"] == ["kill"]
        assert 0 < drill["goodput"] < 1 and drill["seconds"]["productive"] > 0
    (off_kill,), (on_kill,) = ([e for e in variant["events"] if e["kind"] == "kill"] for variant in (off, on))
    assert on_kill["recovery_s"] < off_kill["recovery_s"], (on_kill, off_kill)  # on went on with the survivor
    assert result["goodput_gain"] == round(result["goodput_best"]["on"] - result["goodput_best"]["off"], 4)


@pytest.mark.cluster
def test_planner_bench_predicts_a_drill_with_three_kills_it_did_not_calibrate_on(reused_clusters, demo_workdir):
    from spotray.bench.planner import run

    result = run(steps=480, kills=(3,), rounds=1, clusters=reused_clusters, workdir=demo_workdir)
    assert_made_by(result, "tiny")
    (drill,) = result["drills"]
    assert drill["kills"] == 3 and len(drill["at_steps"]) == 3  # the bench raises unless all 3 were on record
    assert 0 < drill["predicted_goodput"] < 1 and 0 < drill["measured_goodput"] < 1
    assert 0 < drill["predicted_goodput_at_its_step_time"] < 1
    assert result["largest_gap"] == round(abs(drill["predicted_goodput"] - drill["measured_goodput"]), 4)
    assert result["spread_between_repeats"] == {"3": 0.0} and result["calibration"]["times"]["restart_s"] > 0
