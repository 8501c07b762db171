"""The cost arithmetic on ledgers with known attempts, nodes, interruptions and prices."""

from __future__ import annotations

import pytest

from spotray.accounts import cost, goodput, ledger
from spotray.accounts.node_records import NodeFacts

T0 = 1_000_000.0
SPOT, ON_DEMAND = 1.0, 3.0  # USD per hour


def attempt(attempt_id: str, from_step: int, last_step: int, entered: float, last_seen: float, nodes: list[str],
            notice: bool = False, gpus_per_worker: float = 0.0, tokens: int | None = 100,
            ended: str | None = None) -> goodput.AttemptRecord:
    """An attempt whose steps from_step+1..last_step took 10 s and trained ``tokens`` each; ``ended``: the ending the
    driver recorded for it."""
    info = ledger.AttemptInfo(attempt_id, from_step, len(nodes), 4, started_at=entered, nodes=nodes,
                              gpus_per_worker=gpus_per_worker)
    status = {"entered_at": entered, "last_seen": last_seen, "startup_s": 5.0, "checkpoint_save_s": 20.0,
              "eval_s": 0.0, "notice": {"at": last_seen, "step": last_step, "committed": True} if notice else None}
    steps = {s: ledger.StepRecord(attempt_id, 1.0, 10.0, tokens=tokens) for s in range(from_step + 1, last_step + 1)}
    return goodput.AttemptRecord(info, status, steps, recorded={"kind": ended, "reason": "test"} if ended else None)


def node(name: str, created: float, capacity: str = "spot", gpus: int | None = None,
         price: float | None = SPOT) -> NodeFacts:
    return NodeFacts(name, "g5.xlarge", capacity, "us-east-1a", created, gpus, price, ON_DEMAND, "config")


def cost_of(records, facts, **settings) -> cost.RunCost:
    return cost.cost_of(records, goodput.account_of(records, T0), {f.name: f for f in facts}, settings)


def interrupted_run(n2_created: float = T0) -> list[goodput.AttemptRecord]:
    """n1 and n2 train steps 1-10; n2 is lost to a notice at T0+1800; n1 and the replacement n3 (created at T0+1900)
    train 11-20 from T0+2000 to T0+4000."""
    return [attempt("a", 0, 10, T0 + 60, T0 + 1800, ["n1", "n2"], notice=True),
            attempt("b", 10, 20, T0 + 2000, T0 + 4000, ["n1", "n3"])]


def test_nodes_are_billed_through_the_recovery_from_creation_and_not_in_a_lost_spot_nodes_first_hour():
    bill = cost_of(interrupted_run(), [node("n1", T0), node("n2", T0), node("n3", T0 + 1900)])
    by_node = {b.name: b for b in bill.bills}
    assert by_node["n1"].seconds == 4000 - 60  # idle through the recovery, still held
    assert by_node["n2"].free and by_node["n2"].usd == 0.0  # interrupted 1800 s after its creation
    assert by_node["n3"].seconds == 4000 - 1900  # created for the run during the recovery
    assert bill.usd == pytest.approx((3940 + 2100) / 3600 * SPOT)
    assert bill.tokens == 20 * 100
    assert bill.usd is not None
    assert bill.usd_per_million_tokens == pytest.approx(bill.usd / 0.002)
    assert bill.nodes_interrupted == 1 and bill.node_hours == pytest.approx((3940 + 1740 + 2100) / 3600)


def test_a_spot_node_interrupted_after_its_first_hour_is_billed():
    bill = cost_of(interrupted_run(), [node("n1", T0), node("n2", T0 - 7200), node("n3", T0 + 1900)])
    n2 = next(b for b in bill.bills if b.name == "n2")
    assert not n2.free and n2.usd == pytest.approx(1740 / 3600 * SPOT)


def killed_run(ending: str) -> list[goodput.AttemptRecord]:
    """As ``interrupted_run``, but attempt a ends without a notice, by ``ending``."""
    return [attempt("a", 0, 10, T0 + 60, T0 + 1800, ["n1", "n2"], ended=ending), interrupted_run()[1]]


def test_only_the_spot_node_recorded_lost_is_free_after_a_kill():
    lost = NodeFacts(**{**node("n2", T0).to_dict(), "lost_at": T0 + 1800, "lost_reason": "UNEXPECTED_TERMINATION"})
    bill = cost_of(killed_run("kill"), [node("n1", T0), lost, node("n3", T0 + 1900)])
    assert {b.name for b in bill.bills if b.free} == {"n2"} and bill.nodes_interrupted == 1
    bill = cost_of(killed_run("kill"), [node("n1", T0), node("n2", T0), node("n3", T0 + 1900)])
    assert not any(b.free for b in bill.bills)  # no node on record as lost: AWS interrupted none of them


def test_two_spot_nodes_lost_in_one_kill_are_two_nodes_interrupted_for_the_rate_and_one_interruption_of_the_run():
    """The pool's rate is per node: a rate counting the run's restarts would read half of it when AWS takes nodes two at
    a time. A node that was lost but not spot is no interruption of the pool."""
    def lost(name: str, capacity: str = "spot") -> NodeFacts:
        return NodeFacts(**{**node(name, T0, capacity).to_dict(), "lost_at": T0 + 1800,
                            "lost_reason": "UNEXPECTED_TERMINATION"})

    records = [attempt("a", 0, 10, T0 + 60, T0 + 1800, ["n1", "n2", "n4"], ended="kill"),
               attempt("b", 10, 20, T0 + 2000, T0 + 4000, ["n3"])]
    bill = cost_of(records, [lost("n1"), lost("n2"), lost("n4", capacity="on-demand"), node("n3", T0 + 1900)])
    account = goodput.account_of(records, T0)
    assert bill.nodes_interrupted == 2 and len(account.interruptions) == 1
    assert bill.interruptions_per_node_hour == pytest.approx(2 / bill.node_hours)


@pytest.mark.parametrize("ending", ["stopped", "error", "driver_lost", "head_lost", "node_lost", None])
def test_an_ending_that_is_no_spot_interruption_frees_no_node_and_counts_no_interruption(ending):
    lost = NodeFacts(**{**node("n2", T0).to_dict(), "lost_at": T0 + 1800, "lost_reason": "UNEXPECTED_TERMINATION"})
    bill = cost_of(killed_run(ending), [node("n1", T0), lost, node("n3", T0 + 1900)])
    assert not any(b.free for b in bill.bills) and bill.nodes_interrupted == 0
    assert bill.interruptions_per_node_hour == 0.0


def test_a_node_is_billed_for_the_attempts_around_a_pause_not_through_it():
    """A stop, then a rerun on the same node a day later: the run did not hold it in between."""
    records = [attempt("a", 0, 10, T0, T0 + 1000, ["n1"], ended="stopped"),
               attempt("b", 10, 20, T0 + 87_400, T0 + 88_400, ["n1"])]
    bill = cost_of(records, [node("n1", T0 - 7200)], warm_spares=1,
                   head={"usd_per_hour": 0.5}, core_nodes=0)
    assert [b.seconds for b in bill.bills] == [1000, 1000]
    assert bill.usd == pytest.approx(2000 / 3600 * SPOT + 2000 / 3600 * SPOT)  # the nodes, and one warm spare
    assert bill.head_and_core_usd == pytest.approx(2000 / 3600 * 0.5)


def test_the_on_demand_counterfactual_has_the_kept_steps_the_first_start_and_the_saves_in_proportion():
    bill = cost_of(interrupted_run(), [node("n1", T0), node("n2", T0), node("n3", T0 + 1900)])
    seconds = 20 * 10.0 + (60 + 5.0) + 1.0 * (20.0 + 20.0)  # every trained step was kept
    assert bill.on_demand_usd == pytest.approx(seconds / 3600 * 2 * ON_DEMAND)
    assert bill.usd is not None and bill.on_demand_usd is not None
    assert bill.saving == pytest.approx(1 - bill.usd / bill.on_demand_usd)


def test_lost_steps_count_in_the_counterfactual_only_as_a_share_of_the_saves():
    records = [attempt("a", 0, 15, T0, T0 + 100, ["n1"]), attempt("b", 10, 20, T0 + 200, T0 + 300, ["n1"])]
    bill = cost_of(records, [node("n1", T0)])
    kept, trained = 20, 25
    assert bill.tokens == kept * 100
    seconds = kept * 10.0 + 5.0 + kept / trained * 40.0
    assert bill.on_demand_usd == pytest.approx(seconds / 3600 * ON_DEMAND)


def test_a_node_whose_gpus_the_workers_partly_use_is_billed_for_their_share():
    records = [attempt("a", 0, 10, T0, T0 + 3600, ["n1", "n1"], gpus_per_worker=1)]
    bill = cost_of(records, [node("n1", T0, gpus=8)])
    assert bill.bills[0].share == 2 / 8 and bill.usd == pytest.approx(SPOT * 2 / 8)


def test_an_unpriced_node_or_a_step_without_tokens_makes_the_figure_unknown_not_zero():
    records = interrupted_run()
    bill = cost_of(records, [node("n1", T0), node("n2", T0), node("n3", T0 + 1900, price=None)])
    assert bill.usd is None and bill.usd_per_million_tokens is None and bill.saving is None
    assert bill.unpriced == ["n3"]
    untokened = [attempt("a", 0, 10, T0, T0 + 100, ["n1"], tokens=None)]
    assert cost_of(untokened, [node("n1", T0)]).usd_per_million_tokens is None
    assert cost_of(records, []).usd is None  # nodes never looked up


def test_an_unknown_cost_counts_unpriced_nodes_by_type_names_a_few_untyped_ones_and_says_which_setting_fixes_it():
    untyped = [NodeFacts(f"ray-{i}") for i in range(1, 6)]
    typed = [node(f"ip-{i}", T0, price=None) for i in range(64)]
    records = [attempt("a", 0, 10, T0, T0 + 3600, [f"ip-{i}" for i in range(64)])]
    assert cost.money_text(cost_of(records, typed).to_dict()) == (
        "unknown: no price for g5.xlarge spot (64 nodes); set cost.prices, or cost.prices_file from `spotray prices`")
    records = [attempt("a", 0, 10, T0, T0 + 3600, ["ip-0", "ray-1"])]
    assert cost.money_text(cost_of(records, typed[:1] + untyped[:1]).to_dict()) == (
        "unknown: no price for g5.xlarge spot (1 node), 1 node of no known instance type (ray-1); set cost.node (what "
        "the nodes are, off Kubernetes) and cost.prices")
    records = [attempt("a", 0, 10, T0, T0 + 3600, [f"ray-{i}" for i in range(1, 6)])]
    assert cost.money_text(cost_of(records, untyped).to_dict()) == (
        "unknown: no price for 5 nodes of no known instance type (ray-1, ray-2, ray-3 and 2 more); set cost.node (what "
        "the nodes are, off Kubernetes) and cost.prices")
    assert cost.money_text(cost_of(records, []).to_dict()).startswith("unknown: no price for 5 nodes of no known")


def test_warm_spares_and_the_head_and_core_nodes_are_billed_for_the_runs_wall_time():
    records = [attempt("a", 0, 10, T0, T0 + 3600, ["n1"])]
    head, core = {"usd_per_hour": 0.5}, {"usd_per_hour": 0.2}
    bill = cost_of(records, [node("n1", T0)], warm_spares=2, head=head, core=core, core_nodes=3)
    assert bill.usd == pytest.approx(SPOT + 2 * SPOT)  # the workers' line: their nodes and the spares
    assert bill.head_and_core_usd == pytest.approx(0.5 + 3 * 0.2)
    assert cost_of(records, [node("n1", T0)], head=head).head_and_core_usd == pytest.approx(0.5)
    assert cost_of(records, [node("n1", T0)], head={"usd_per_hour": None}).head_and_core_usd is None
    assert cost_of(records, [node("n1", T0)]).head_and_core_usd is None


def test_the_observed_interruption_rate_is_trusted_only_past_the_documented_thresholds():
    bill = cost_of(interrupted_run(), [node("n1", T0), node("n2", T0), node("n3", T0 + 1900)])
    assert bill.interruptions_per_node_hour == pytest.approx(1 / bill.node_hours)
    assert not bill.rate_trusted
    many = cost.RunCost(1.0, None, 1, 2.0, cost.TRUSTED_NODE_HOURS, cost.TRUSTED_INTERRUPTIONS, False, [], [])
    assert many.rate_trusted


def test_the_live_cost_waits_for_the_drivers_node_record_then_prices_the_attempt(tmp_path):
    import json
    import time

    from spotray.accounts import node_records
    from spotray.storage import resolve

    root = resolve(str(tmp_path))
    info = ledger.AttemptInfo("a", 0, 1, 4, started_at=T0, nodes=["n1"])
    ledger.write_attempt(root, info)
    root.child("a", goodput.STATUS_FILE).write_text(json.dumps({"entered_at": T0, "last_seen": T0 + 3600}))
    live = cost.LiveCost(root, info)

    def refreshed(now: float) -> cost.RunCost:
        live.poke(now)
        with live._busy:  # the refresh thread holds it until it is done
            assert live.latest is not None
            return live.latest

    assert refreshed(time.time()).usd is None  # the driver has not recorded the node yet
    root.child(node_records.NODES_FILE).write_text(json.dumps({"n1": node("n1", T0).to_dict()}))
    assert refreshed(time.time()).usd is None  # not due yet
    assert refreshed(time.time() + cost.UNRECORDED_REFRESH_S).usd == pytest.approx(SPOT)
    assert refreshed(time.time() + 3 * cost.UNRECORDED_REFRESH_S).usd == pytest.approx(SPOT)
    assert live._next_at > time.time() + live.refresh_s / 2  # recorded: refreshed every refresh_s from now on
