"""How the printed lines write counts."""

from __future__ import annotations

from spotray.formats import step_count, workers


def test_a_count_takes_the_plural_only_where_it_is_not_one():
    assert [workers(n) for n in (1, 2, 0)] == ["1 worker", "2 workers", "0 workers"]
    assert [step_count(n) for n in (1, 2, 0)] == ["1 step", "2 steps", "0 steps"]
