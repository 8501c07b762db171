"""The rule that seats the survivors, asked as the keeper asks it: workers by name, times given."""

from __future__ import annotations

from spotray.survivors.generations import DONE, LEAVE, NOTHING_LOST, WAIT, Generations, Seat


def first_generation(workers: int = 3, min_workers: int = 2) -> Generations:
    rule = Generations(workers, min_workers)
    for name in "abc"[:workers]:
        rule.ask(name, 0, False, now=0.0)
    return rule


def test_the_first_generation_waits_for_the_whole_group_and_seats_it_in_the_order_it_asked():
    rule = Generations(3, 2)
    assert rule.ask("a", 0, False, now=0.0) == WAIT and rule.ask("b", 0, False, now=1.0) == WAIT
    assert rule.ask("c", 0, False, now=2.0) == Seat(1, 2, 3)
    assert rule.ask("a", 0, False, now=2.1) == Seat(1, 0, 3)


def test_a_group_from_nothing_forms_with_fewer_only_after_it_settled_and_never_below_min_workers():
    rule = Generations(3, 2, settle_s=5.0)
    assert rule.ask("a", 0, False, now=0.0) == WAIT
    assert rule.ask("a", 0, False, now=9.0) == WAIT  # 1 < min_workers, however long
    assert rule.ask("b", 0, False, now=9.5) == Seat(1, 1, 2)  # a waited 9.5 s >= settle_s


def test_a_lost_member_makes_the_next_generation_of_the_others_once_each_has_asked():
    rule = first_generation()
    rule.lose("b")
    assert rule.ask("c", 1, True, now=3.0) == WAIT  # a has not asked yet
    assert rule.ask("a", 1, True, now=3.1) == Seat(2, 0, 2)
    assert rule.ask("c", 1, True, now=3.2) == Seat(2, 1, 2)


def test_no_generation_is_smaller_than_min_workers():
    rule = first_generation()
    rule.lose("b")
    rule.lose("c")
    assert rule.ask("a", 1, True, now=3.0) == WAIT


def test_a_failure_with_no_member_lost_is_the_askers_own_after_nothing_lost_s():
    rule = first_generation()
    assert rule.ask("a", 1, True, now=3.0) == WAIT
    assert rule.ask("a", 1, True, now=3.0 + rule.nothing_lost_s) == NOTHING_LOST


def test_a_newcomer_waits_until_the_members_ask_then_joins_after_them():
    rule = first_generation()
    rule.lose("b")
    for name in "ac":
        rule.ask(name, 1, True, now=3.0)
    assert rule.ask("d", 0, False, now=4.0) == WAIT and rule.newcomers_wait()
    assert rule.ask("c", 2, False, now=5.0) == WAIT  # growing back: a has not asked yet
    assert rule.ask("a", 2, False, now=5.1) == Seat(3, 0, 3)
    assert rule.ask("d", 0, False, now=5.2) == Seat(3, 2, 3) and not rule.newcomers_wait()


def test_members_that_ended_their_generation_to_grow_form_it_again_where_nothing_changed_since():
    """The newcomer they ended it for went silent, or a fit that was to end did not: they never wait for nothing."""
    rule = first_generation()
    rule.ask("d", 0, False, now=4.0)
    rule.lose("d")
    assert rule.ask("a", 1, False, now=5.0) == WAIT  # b and c have not asked yet
    rule.ask("b", 1, False, now=5.1)
    assert rule.ask("c", 1, False, now=5.2) == Seat(2, 2, 3)
    assert rule.ask("a", 1, False, now=5.3) == Seat(2, 0, 3)


def test_a_member_on_a_draining_node_leaves_for_good_and_the_others_go_on():
    rule = first_generation()
    rule.leave("c")
    assert rule.others_suffice()
    assert rule.ask("c", 1, False, now=3.0) == LEAVE
    rule.ask("a", 1, False, now=3.0)
    assert rule.ask("b", 1, False, now=3.1) == Seat(2, 1, 2)
    assert rule.ask("c", 1, False, now=4.0) == LEAVE


def test_a_newcomer_that_went_silent_is_forgotten():
    rule = first_generation()
    rule.ask("d", 0, False, now=4.0)
    rule.lose("d")
    assert not rule.newcomers_wait()


def test_once_the_run_finished_a_waiting_worker_is_done():
    rule = first_generation()
    rule.ask("d", 0, False, now=4.0)
    rule.finished = True
    assert rule.ask("d", 0, False, now=5.0) == DONE
