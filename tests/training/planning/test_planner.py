"""``spotray estimate``: the planner's model (rate per node, the auto interval, on-demand, warm spares), its bad
input, and its validation against a real run's ledger (tests/fixtures/ledger-interrupted, README there)."""

import argparse
import json
import math
import shlex
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from spotray.accounts import goodput, ledger
from spotray.errors import SpotrayError
from spotray.planning import calibration, planner
from spotray.planning import estimate as command
from spotray.storage import resolve
from spotray.worker.cadence import interval_steps, snapshot_interval_steps, snapshot_spacing
from tests.repo import REPO, readme_example

INTERRUPTED_RUN = REPO / "tests" / "fixtures" / "ledger-interrupted"
RUN_EVERY_STEPS = 50  # the demo config's checkpoint.every_steps (the fixture's README)

BASE = planner.Inputs(step_s=2.0, tokens_per_step=1e6, restart_s=300.0, steps=10_000, nodes=(8,),
                      interruptions_per_node_hour=0.01, blocking_save_s=5.0, save_s=5.0, restore_s=20.0,
                      spot_price=10.0, on_demand_price=25.0)


def one(inputs: planner.Inputs, nodes: int, capacity: str) -> planner.Plan:
    return next(p for p in planner.plan(inputs) if p.nodes == nodes and p.capacity == capacity)


def warm_spare(plan: planner.Plan) -> planner.WarmSpare:
    assert plan.warm_spare is not None
    return plan.warm_spare


def estimate(*argv: str) -> argparse.Namespace:
    """``spotray estimate ARGV`` as the CLI runs it (the lead wires the same two functions into cli.py)."""
    parser = argparse.ArgumentParser(prog="spotray estimate")
    command.add_arguments(parser)
    args = parser.parse_args(list(argv))
    command.run(args)
    return args


def test_the_runs_rate_is_the_per_node_rate_times_the_nodes_so_large_runs_lose_more():
    inputs = replace(BASE, nodes=(8, 64, 512))
    spot = {p.nodes: p for p in planner.plan(inputs) if p.capacity == "spot"}
    assert [spot[n].interruptions_per_hour for n in (8, 64, 512)] == pytest.approx([0.08, 0.64, 5.12])
    assert spot[8].goodput > spot[64].goodput > spot[512].goodput
    for p in spot.values():  # the expected count is the run's rate over its wall time
        assert p.wall_s is not None
        assert p.expected_interruptions == pytest.approx(p.interruptions_per_hour * p.wall_s / 3600)
    assert spot[64].step_s == pytest.approx(BASE.step_s * 8 / 64)  # ideal scaling from --step-nodes


def test_the_interval_is_what_every_steps_auto_chooses_at_the_runs_rate():
    for nodes in (8, 64, 512):
        p = one(replace(BASE, nodes=(nodes,)), nodes, "spot")
        assert p.interval_steps == interval_steps(5.0, 5.0, p.step_s, 0.01 * nodes, 10_000)
    fixed = one(replace(BASE, every_steps=123), 8, "spot")
    assert fixed.interval_steps == 123
    assert fixed.seconds["checkpoint_save"] == pytest.approx(math.ceil(10_000 / 123) * 5.0)


def test_wall_time_solves_for_the_interruptions_it_holds():
    p = one(BASE, 8, "spot")
    assert p.wall_s is not None and p.expected_interruptions is not None
    k = p.interval_steps
    loss = k / 2 * 2.0 + 300 + 20  # half an interval of steps + restart + restore (a sync save leaves none unsaved)
    assert p.loss_per_interruption_s == pytest.approx(loss)
    base = 10_000 * 2.0 + math.ceil(10_000 / k) * 5.0 + 300  # productive + saves + startup (the restart time)
    assert p.wall_s == pytest.approx(base + p.expected_interruptions * loss)
    assert p.goodput == pytest.approx(20_000 / p.wall_s)
    async_save = one(replace(BASE, blocking_save_s=1.0, save_s=5.0), 8, "spot")  # in flight: 4 s more lost
    assert async_save.loss_per_interruption_s == pytest.approx(async_save.interval_steps + 4 + 320)


def test_on_demand_has_no_interruptions_and_saves_once_at_the_end_under_auto():
    p = one(BASE, 8, "on-demand")
    assert p.expected_interruptions == 0
    assert p.interval_steps == 10_000
    productive, saves, startup = 20_000.0, 5.0, 300.0
    assert p.goodput == pytest.approx(productive / (productive + saves + startup))
    fixed = one(replace(BASE, every_steps=1000), 8, "on-demand")
    assert fixed.goodput == pytest.approx(productive / (productive + 10 * 5.0 + startup))
    failing = one(replace(BASE, on_demand_interruptions_per_node_hour=0.001), 8, "on-demand")
    assert failing.expected_interruptions is not None
    assert failing.expected_interruptions > 0 and failing.goodput < p.goodput


def test_dollars_are_nodes_times_wall_hours_times_the_price_and_spares_are_billed_on_spot():
    p = one(BASE, 8, "spot")
    assert p.wall_s is not None and p.usd is not None
    assert p.usd == pytest.approx(8 * p.wall_s / 3600 * 10.0)
    assert p.usd_per_mtok == pytest.approx(p.usd / (10_000 * 1e6 / 1e6))
    spared = one(replace(BASE, warm_spares=2, capacity_wait_s=240), 8, "spot")
    assert spared.restart_s == 60  # restart less the capacity wait
    assert spared.wall_s is not None
    assert spared.usd == pytest.approx((8 + 2) * spared.wall_s / 3600 * 10.0)
    assert one(replace(BASE, spot_price=None), 8, "spot").usd is None  # unknown, never zero


def test_the_warm_spare_verdict_weighs_its_idle_cost_against_the_recovery_it_saves():
    inputs = replace(BASE, capacity_wait_s=240)  # a spare saves 240 s of each restart
    p = one(inputs, 8, "spot")
    assert p.wall_s is not None and p.expected_interruptions is not None
    spare = warm_spare(p)
    assert spare.idle_usd == pytest.approx(p.wall_s / 3600 * 10.0)
    assert spare.saves_usd == pytest.approx(8 * 240 / 3600 * 10.0 * p.expected_interruptions)
    assert spare.pays is False  # 8 nodes at 0.08 interruptions an hour: the spare idles for nothing
    assert warm_spare(one(replace(inputs, nodes=(512,)), 512, "spot")).pays is True  # 512 nodes: it pays
    # An on-demand spare for a spot pool: the verdict flips with the spare's price
    assert warm_spare(one(replace(inputs, nodes=(64,), warm_spare_price=2.0), 64, "spot")).pays is True
    assert warm_spare(one(replace(inputs, nodes=(64,), warm_spare_price=40.0), 64, "spot")).pays is False
    assert one(inputs, 8, "on-demand").warm_spare is None  # nothing to recover from
    assert one(BASE, 8, "spot").warm_spare is None  # no warm-spare restart time to compare with


def test_snapshots_lose_half_a_snapshot_interval_restore_from_memory_and_cost_their_blocking_time():
    fixed = one(replace(BASE, snapshot_s=0.5, snapshot_every_steps=10), 8, "spot")
    assert fixed.snapshot_interval_steps == 10
    assert fixed.loss_per_interruption_s == pytest.approx(10 / 2 * 2.0 + 300)  # no restore from storage
    assert fixed.seconds["snapshot"] == pytest.approx(1000 * 0.5)
    assert one(replace(BASE, snapshot_s=0.5), 8, "spot").goodput > one(BASE, 8, "spot").goodput  # under auto
    auto = replace(BASE, snapshot_s=0.5, nodes=(8, 64))
    for nodes in (8, 64):
        p = one(auto, nodes, "spot")
        blocking = 0.5 * 8 / nodes  # each node copies its shard, which shrinks as nodes grow
        assert planner.snapshot_time(auto, nodes) == pytest.approx(blocking)
        auto_steps = snapshot_interval_steps(blocking, blocking, p.step_s, 0.01 * nodes)
        assert p.snapshot_interval_steps == snapshot_spacing(auto_steps, p.interval_steps)  # spread as a run does
    assert one(BASE, 8, "spot").snapshot_interval_steps is None and one(BASE, 8, "spot").seconds["snapshot"] == 0
    # Checkpoints more often than snapshots' budget allows: none are taken, so a kill restores from storage.
    often = one(replace(BASE, snapshot_s=0.5, every_steps=20), 8, "spot")
    assert often.snapshot_interval_steps is None
    assert often.loss_per_interruption_s == pytest.approx(one(replace(BASE, every_steps=20), 8, "spot")
                                                          .loss_per_interruption_s)
    # A fixed interval longer than the checkpoints': a snapshot at its multiples only, so most kills read storage.
    rare = one(replace(BASE, snapshot_s=0.5, snapshot_every_steps=40, every_steps=20), 8, "spot")
    assert rare.snapshot_interval_steps == 40 and rare.seconds["snapshot"] == pytest.approx(10_000 / 40 * 0.5)
    assert rare.loss_per_interruption_s == pytest.approx(often.loss_per_interruption_s)


def test_going_on_with_the_survivors_costs_two_restarts_without_the_wait_and_the_wait_at_one_node_less():
    inputs = replace(BASE, capacity_wait_s=240, shrink=True)  # on the survivors: 60 s, no wait
    p = one(inputs, 8, "spot")
    lost_steps = p.interval_steps / 2 * 2.0 + 20  # half an interval, and the restore from storage
    assert p.loss_per_interruption_s == pytest.approx(lost_steps + 2 * 60 + 240 / 8)
    assert p.goodput > one(replace(inputs, shrink=False), 8, "spot").goodput
    assert one(replace(inputs, nodes=(1,)), 1, "spot").loss_per_interruption_s == pytest.approx(
        one(replace(inputs, nodes=(1,), shrink=False), 1, "spot").loss_per_interruption_s)  # no survivor
    spared = one(replace(inputs, warm_spares=1), 8, "spot")  # a spare takes over: one restart, no shrinking
    assert spared.loss_per_interruption_s == pytest.approx(lost_steps + 60)
    assert p.wall_s is not None and p.expected_interruptions is not None
    assert warm_spare(p).saves_usd == pytest.approx(8 * (60 + 240 / 8) / 3600 * 10.0 * p.expected_interruptions)


def test_a_run_interrupted_faster_than_it_recovers_never_finishes():
    p = one(replace(BASE, nodes=(512,), interruptions_per_node_hour=0.05), 512, "spot")
    assert p.wall_s is None and p.goodput == 0.0 and p.usd is None
    assert "never ends" in command.render(BASE, [p])


def test_save_and_restore_times_follow_the_checkpoints_bytes_over_the_bandwidth_of_all_nodes():
    inputs = replace(BASE, blocking_save_s=None, save_s=None, restore_s=None, checkpoint_bytes=112e9,
                     storage_bytes_per_s=2e9)
    assert planner.save_times(inputs, 8) == pytest.approx((7.0, 7.0, 7.0))
    assert planner.save_times(inputs, 64) == pytest.approx((0.875, 0.875, 0.875))
    blocking, save, _ = planner.save_times(replace(inputs, async_save=True), 8)
    assert blocking == pytest.approx(7.0 * planner.BENCH_ASYNC_BLOCKED_RATIO) and save == pytest.approx(7.0)
    bench = replace(BASE, blocking_save_s=None, save_s=None, restore_s=None)  # nothing given: the bench figures
    assert planner.save_times(bench, 8) == (planner.BENCH_SAVE_S, planner.BENCH_SAVE_S, planner.BENCH_RESTORE_S)


@pytest.mark.parametrize(("argv", "flag"), [
    (["--tokens", "1T", "--tokens-per-step", "4M", "--step-s", "7", "--restart-s", "600"],
     "--interruptions-per-node-hour"),
    (["--tokens", "1T", "--tokens-per-step", "4M", "--restart-s", "600", "--interruptions-per-node-hour", "0.001"],
     "--step-s"),
    (["--tokens", "1T", "--tokens-per-step", "4M", "--step-s", "7", "--interruptions-per-node-hour", "0.001"],
     "--restart-s"),
    (["--tokens", "lots", "--tokens-per-step", "4M", "--step-s", "7", "--restart-s", "1",
      "--interruptions-per-node-hour", "0.001"], "--tokens"),
    (["--tokens", "1T", "--tokens-per-step", "4M", "--step-s", "7", "--restart-s", "600",
      "--interruptions-per-node-hour", "0.001", "--spot-price", "-3"], "--spot-price"),
    (["--tokens", "1T", "--tokens-per-step", "4M", "--step-s", "7", "--restart-s", "600",
      "--interruptions-per-node-hour", "0.001", "--nodes", "8,x"], "--nodes"),
    (["--tokens", "1T", "--steps", "9", "--tokens-per-step", "4M", "--step-s", "7", "--restart-s", "600",
      "--interruptions-per-node-hour", "0.001"], "--tokens"),
    (["--tokens", "1T", "--tokens-per-step", "4M", "--step-s", "7", "--restart-s", "600",
      "--interruptions", "3", "--nodes", "8,64"], "--interruptions"),
    (["--tokens", "1T", "--tokens-per-step", "4M", "--step-s", "7", "--restart-s", "60", "--capacity-wait-s", "90",
      "--interruptions-per-node-hour", "0.001"], "--capacity-wait-s"),
    (["--from", "/nonexistent/run", "--interruptions-per-node-hour", "0.001"], "--from"),
    (["--tokens", "1T", "--tokens-per-step", "4M", "--step-s", "7", "--restart-s", "600", "--warm-spares", "1",
      "--interruptions-per-node-hour", "0.001"], "--warm-spares"),
    (["--tokens", "1T", "--tokens-per-step", "4M", "--step-s", "7", "--restart-s", "600", "--shrink",
      "--interruptions-per-node-hour", "0.001"], "--shrink"),
    (["--tokens", "1T", "--tokens-per-step", "4M", "--step-s", "7", "--restart-s", "600",
      "--snapshot-every-steps", "10", "--interruptions-per-node-hour", "0.001"], "--snapshot-every-steps"),
    (["--tokens", "1T", "--tokens-per-step", "4M", "--step-s", "7", "--restart-s", "600", "--snapshot-s", "-1",
      "--interruptions-per-node-hour", "0.001"], "--snapshot-s"),
])
def test_bad_input_is_one_line_naming_the_flag_and_the_fix_exit_2(argv, flag):
    with pytest.raises(SpotrayError) as caught:
        estimate(*argv)
    message = str(caught.value)
    assert message.startswith(flag), message
    assert "\n" not in message and (";" in message or "give" in message), message  # the problem, then the fix
    assert caught.value.exit_code == 2


def test_every_missing_input_is_named_in_one_line_not_one_run_at_a_time():
    with pytest.raises(SpotrayError) as caught:
        estimate("--nodes", "8", "--tokens-per-step", "4M")
    line = str(caught.value)
    assert line.startswith("--step-s, --restart-s, --interruptions-per-node-hour, --tokens: are required (--step-s: "
                           "seconds per training step; --restart-s: seconds from an "), line
    assert "\n" not in line and line.endswith("measures the step, batch and restart") and caught.value.exit_code == 2


def test_the_table_has_a_row_per_size_and_capacity_and_json_has_the_same_plans(capsys):
    argv = ["--tokens", "1T", "--tokens-per-step", "4M", "--step-s", "7", "--step-nodes", "8", "--nodes", "8,64,512",
            "--checkpoint-gb", "112", "--storage-gb-s", "2", "--interruptions-per-node-hour", "0.001",
            "--restart-s", "600", "--capacity-wait-s", "420", "--spot-price", "30", "--on-demand-price", "55"]
    estimate(*argv)
    text = capsys.readouterr().out
    rows = [line.split()[:2] for line in text.splitlines()[1:7]]
    assert rows == [[n, c] for n in ("8", "64", "512") for c in ("spot", "on-demand")]
    assert "saves" in text and "pays" in text
    estimate(*argv, "--json")
    report = json.loads(capsys.readouterr().out)
    assert [(p["nodes"], p["capacity"]) for p in report["plans"]] == [(n, c) for n in (8, 64, 512)
                                                                      for c in ("spot", "on-demand")]
    spot = [p for p in report["plans"] if p["capacity"] == "spot"]
    assert spot[0]["goodput"] > spot[1]["goodput"] > spot[2]["goodput"]
    assert all(p["usd_per_mtok"] > 0 for p in report["plans"])
    assert report["defaults"] == [] and "defaults from" not in text  # bytes and bandwidth given: nothing stands in


def test_the_bench_defaults_never_stand_in_silently(capsys):
    bench = replace(BASE, blocking_save_s=None, save_s=None, restore_s=None, async_save=True)
    assert [d.split(",")[0] for d in planner.defaults_used(bench)] == [
        "the save time", "an async save's blocking share", "the restore time"]
    sized = replace(bench, async_save=False, checkpoint_bytes=112e9)
    assert planner.defaults_used(sized) == ["the storage's bandwidth per node (give --storage-gb-s)"]
    assert planner.defaults_used(replace(sized, storage_bytes_per_s=2e9)) == []
    estimate("--steps", "1000", "--tokens-per-step", "1e6", "--step-s", "1", "--restart-s", "300",
             "--interruptions-per-node-hour", "0.01", "--spot-price", "1", "--on-demand-price", "3")
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("defaults from")]
    assert planner.BENCH_SOURCE in line and "not your cluster's" in line and "--save-s" in line


# ---- validation against a real run ----------------------------------------------------------------------------


def test_the_planner_predicts_a_real_runs_goodput_within_5_points_from_its_measured_times_and_fault_count():
    """The fixture is a real `spotray demo` run (a notice, then a kill): the planner, fed the times its ledger
    measured and its count of interruptions, predicts its goodput."""
    measured = goodput.account(ledger.attempts_root(resolve(str(INTERRUPTED_RUN))))
    assert len(measured.events) == 2 and {e.kind for e in measured.events} == {"notice", "kill"}
    run = calibration.inputs_from_run(str(INTERRUPTED_RUN), every_steps=RUN_EVERY_STEPS)
    assert run.goodput == pytest.approx(measured.goodput)
    assert run.values["interruptions"] == 2
    inputs = planner.Inputs(**run.values)
    predicted = one(inputs, inputs.nodes[0], "spot")
    assert predicted.expected_interruptions == 2
    assert predicted.interval_steps == RUN_EVERY_STEPS
    assert abs(predicted.goodput - measured.goodput) < 0.05, (predicted.goodput, measured.goodput)


def test_from_a_run_infers_its_checkpoint_interval_from_the_kept_checkpoints_and_replays_it(capsys):
    run = calibration.inputs_from_run(str(INTERRUPTED_RUN))
    assert run.values["every_steps"] == RUN_EVERY_STEPS
    assert run.values["step_nodes"] == 2 and run.values["tokens_per_step"] == 16 * 128
    assert run.values["checkpoint_bytes"] > 0 and 0 < run.values["notice_share"] < 1
    estimate("--from", str(INTERRUPTED_RUN), "--json")
    report = json.loads(capsys.readouterr().out)
    spot = report["plans"][0]
    assert report["defaults"] == []  # the run measured its save and restore times
    assert report["measured"]["goodput"] == pytest.approx(run.goodput, abs=1e-4)
    assert abs(spot["goodput"] - run.goodput) < 0.05
    with pytest.raises(SpotrayError, match="^--interruptions-per-node-hour: .* saw 2 spot nodes interrupted in"):
        estimate("--from", str(INTERRUPTED_RUN), "--nodes", "8,64")
    for longer in (("--tokens", "1B"), ("--steps", "1000000")):  # the run's 2 interruptions were in its 1,800 steps
        with pytest.raises(SpotrayError, match=r"another size or length than the run's \(2 nodes, 1,800 steps\)"):
            estimate("--from", str(INTERRUPTED_RUN), *longer)
    estimate("--from", str(INTERRUPTED_RUN), "--nodes", "8,64", "--interruptions-per-node-hour", "0.01",
             "--every-steps", "auto")  # flags override the run's figures
    assert "64     spot" in capsys.readouterr().out


def test_from_a_run_that_took_snapshots_measures_what_one_blocks_and_plans_them(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(INTERRUPTED_RUN, run)
    assert "snapshot_s" not in calibration.inputs_from_run(str(run)).values  # it took none
    for number, status_file in enumerate(sorted(run.glob("attempts/*/status.json"))):
        status = json.loads(status_file.read_text())
        status.update(snapshots=10 * (number + 1), snapshot_save_s=0.5 * (number + 1))
        status_file.write_text(json.dumps(status))
    assert calibration.inputs_from_run(str(run)).values["snapshot_s"] == pytest.approx(3.0 / 60)
    estimate("--from", str(run), "--json")
    assert json.loads(capsys.readouterr().out)["inputs"]["snapshot_s"] == pytest.approx(3.0 / 60)


@pytest.mark.parametrize(("example", "goodputs"), [
    ("estimate-7b", ["99.7%", "99.9%", "98.5%", "99.5%", "89.2%", "96.3%"]),
    ("estimate-7b-snapshots", ["99.8%", "99.9%", "99.5%", "99.8%", "97.5%", "99.0%"]),
])
def test_the_7b_examples_give_the_goodputs_the_docs_show(capsys, example, goodputs):
    shown = shlex.split(readme_example(example).replace("\\\n", " "))
    assert shown[:2] == ["spotray", "estimate"], shown
    estimate(*shown[2:])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:7]]
    sizes = [("8", "spot"), ("8", "on-demand"), ("64", "spot"), ("64", "on-demand"), ("512", "spot"),
             ("512", "on-demand")]
    assert [(r[0], r[1], r[2]) for r in rows] == [(*size, goodput) for size, goodput in zip(sizes, goodputs,
                                                                                             strict=True)]


def interrupted_ledger(root: Path, kills: int, hours_each: float) -> str:
    """A run on one node a time, killed ``kills`` times after ``hours_each`` hours of 100 steps (a save each 50); the
    driver recorded each kill as a spot node's loss."""
    import json as json_

    from spotray.accounts import endings, node_records

    attempts = resolve(str(root)).child("attempts")
    attempts.child(ledger._RUN_FILE).write_text(json_.dumps({"started_at": 1e9}))
    writer, at = ledger.RecordWriter(), 1e9
    for k in range(kills + 1):
        aid, step_s = f"{k:03d}", hours_each * 3600 / 100
        ledger.write_attempt(attempts, ledger.AttemptInfo(aid, 50 * k, 1, 4, started_at=at, nodes=[f"n{k}"]))
        losses = ledger.LossLog(attempts, aid, writer)
        for step in range(50 * k + 1, 50 * k + 101):
            losses.record(step, 1.0, step_s, tokens=1000)
        losses.flush()
        status = {"entered_at": at, "last_seen": at + hours_each * 3600, "restore_s": 10.0, "checkpoint_save_s": 2.0,
                  "first_step_at": at + 60 + step_s, "max_steps": 100 * (kills + 1)}
        writer.put(ledger.attempt_file(attempts, aid, goodput.STATUS_FILE), json_.dumps(status))
        if k < kills:
            endings.record(attempts, aid, endings.KILL, f"node n{k} (spot) lost: Ray says UNEXPECTED_TERMINATION")
        at += hours_each * 3600 + 60
    writer.close(timeout_s=10)
    facts = {f"n{k}": node_records.NodeFacts(f"n{k}", "g5.xlarge", "spot") for k in range(kills + 1)}
    attempts.child(node_records.NODES_FILE).write_text(json_.dumps({n: f.to_dict() for n, f in facts.items()}))
    return str(root)


def test_other_sizes_use_the_rate_the_run_saw_once_it_is_trusted_else_ask_for_the_pools(tmp_path, capsys):
    trusted = interrupted_ledger(tmp_path / "long", kills=5, hours_each=4.0)  # 5 in 24 node-hours
    estimate("--from", trusted, "--every-steps", "50", "--nodes", "8,64", "--spot-price", "1", "--on-demand-price",
             "3", "--json")
    report = json.loads(capsys.readouterr().out)
    assert report["inputs"]["interruptions_per_node_hour"] == pytest.approx(5 / 24, rel=0.01)
    short = interrupted_ledger(tmp_path / "short", kills=4, hours_each=4.0)  # 4 in 20 node-hours: not yet
    with pytest.raises(SpotrayError, match="the run saw 4 spot nodes interrupted in 20.0"):
        estimate("--from", short, "--every-steps", "50", "--nodes", "8,64")
