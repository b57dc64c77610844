"""The perfect-statistics ceiling of bench/policy_ceiling.py on one real dev zone: the
table's premise (what the default's forecast costs) holds only if the ceiling is a real
run of the same DP, bounded below by the optimum and never missing the deadline."""

from __future__ import annotations

import numpy as np

from bench.policy_ceiling import ceiling_case, perfect_statistics, table
from tests.support.spot_helpers import TRACES


def test_the_ceiling_is_a_real_run_no_cheaper_than_the_optimum(tmp_path):
    path = TRACES / "aws-v100-4node-600s" / "us-west-2c_v100_1.json"
    row = ceiling_case(("us-west-2c", [path], 52.0, 0.2, 3, tmp_path / "cache.jsonl"))
    mean = row["mean"]
    assert row["misses"]["default"] == 0
    assert mean["optimal"] <= mean["ceiling"] + 1e-6
    assert mean["ceiling"] < 1.2 * mean["uniform-progress"]  # a plan, not on-demand throughout
    text = table([row], "one zone", "python -m bench.policy_ceiling", 1.0)
    assert "| us-west-2c | 52 | 0.2 |" in text and "ceiling: gap closed" in text


def test_perfect_statistics_hide_nothing_of_the_window_from_the_fit():
    from spot_core.policy.deadline.base import Job, Window

    available = np.array([[True, False, True, True]])
    window = Window(
        start=0,
        ticks=4,
        tick_seconds=600.0,
        job=Job.from_hours(0.5, 1.0, 0.05),
        available=available,
        price=np.ones((1, 4)),
        on_demand_price=3.0,
        past_available=np.zeros((1, 0), dtype=bool),
        past_price=np.zeros((1, 0)),
        zones=("z",),
    )
    seen = perfect_statistics(window)
    assert (seen.past_available == available).all() and seen.past_price.shape == (1, 4)
    assert window.past_available.shape == (1, 0)  # the original is untouched
