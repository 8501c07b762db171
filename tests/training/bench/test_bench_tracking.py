"""``spotray bench tracking`` on the tiny preset: it runs, its JSON has its keys, its ratios are finite and positive,
and the tracked runs' trackers missed nothing."""

from __future__ import annotations

import pytest

from tests.training.bench.test_bench import assert_ratios, bench


@pytest.mark.e2e  # a bench command on the session's Ray
def test_tracking_bench(ray_address):
    result = bench("tracking", "--steps", "12", "--rounds", "1", ray_address=ray_address)
    assert {variant: len(seconds) for variant, seconds in result["step_s"].items()} == {
        "none": 1, "tracked": 1, "none_again": 1}
    assert_ratios(result, "tracked_over_none", "none_over_none")
    assert result["tracking_gaps"] == []
