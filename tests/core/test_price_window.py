"""Price-window start: hour-of-week profiles from history, and the plan they lead to."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np
import pytest

from spot_core.errors import ConfigError
from spot_core.market.trace import ZoneTrace
from spot_core.model import Market, Offer, Pool
from spot_core.policy.price_window import (
    HourOfWeekProfile,
    StartPlan,
    build_profile,
    hour_of_week,
    plan_start,
    start_now,
)

MONDAY = datetime(2026, 11, 30, tzinfo=UTC).timestamp()  # a Monday, 00:00 UTC
HOUR = 3600.0


def _trace(zone: str, prices, available, start=MONDAY, tick=HOUR) -> ZoneTrace:
    return ZoneTrace(
        f"{zone}_v100_1",
        tick,
        np.asarray(available, dtype=bool),
        np.asarray(prices, dtype=float),
        3.0,
        start,
        "test",
    )


def _profile(**zones: tuple[float, float]) -> HourOfWeekProfile:
    return HourOfWeekProfile(
        {z: (p,) * 168 for z, (p, _) in zones.items()},
        {z: (a,) * 168 for z, (_, a) in zones.items()},
        3.0,
    )


def test_hour_of_week_is_monday_based_utc():
    assert hour_of_week(MONDAY) == 0
    assert hour_of_week(MONDAY + 25 * HOUR + 59) == 25
    assert hour_of_week(0.0) == 72  # the epoch was a Thursday


def test_profile_averages_by_hour_of_week():
    prices = np.tile(np.arange(168, dtype=float), 2)
    prices[168:] += 2.0  # second week dearer by 2
    profile = build_profile([_trace("z1", prices, np.ones(336))])
    assert profile.zone_prices["z1"][5] == pytest.approx(6.0)
    assert profile.zone_availability["z1"] == (1.0,) * 168
    assert profile.on_demand_price == 3.0


def test_profile_uses_only_history_before_until():
    prices = np.r_[np.ones(168), np.full(168, 9.0)]
    avail = np.r_[np.ones(168), np.zeros(168)]
    profile = build_profile([_trace("z1", prices, avail)], until=MONDAY + 168 * HOUR)
    assert set(profile.zone_prices["z1"]) == {1.0}
    assert set(profile.zone_availability["z1"]) == {1.0}


def test_unseen_hours_take_the_zone_mean():
    profile = build_profile([_trace("z1", [1.0, 3.0], [1, 0])])
    assert profile.zone_prices["z1"][100] == pytest.approx(2.0)
    assert profile.zone_availability["z1"][100] == pytest.approx(0.5)


def test_traces_without_start_time_need_an_origin():
    trace = _trace("z1", [1.0], [1], start=None)
    with pytest.raises(ConfigError, match="origin"):
        build_profile([trace])
    assert build_profile([trace], origin=MONDAY).zone_prices["z1"][0] == 1.0


def test_profile_round_trips_through_json():
    profile = build_profile(
        [_trace("a", np.arange(168.0), np.ones(168)), _trace("b", np.ones(168), np.zeros(168))]
    )
    again = HourOfWeekProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again == profile


def test_malformed_profile_is_a_config_error():
    with pytest.raises(ConfigError, match="168"):
        HourOfWeekProfile({"a": (1.0,) * 10}, {"a": (1.0,) * 10}, 3.0)
    with pytest.raises(ConfigError, match="malformed"):
        HourOfWeekProfile.from_dict({"zone_prices": {}})


def test_plan_waits_for_the_cheap_hours():
    prices = [2.0] * 168
    prices[10:14] = [0.5] * 4  # Monday 10:00-14:00 is cheap
    profile = HourOfWeekProfile({"z": tuple(prices)}, {"z": (1.0,) * 168}, 3.0)
    plan = plan_start(
        profile, job_hours=4, window_start=MONDAY, window_end=MONDAY + 24 * HOUR, now=MONDAY + 60
    )
    assert plan.start_at == MONDAY + 10 * HOUR
    assert plan.zone == "z"
    assert plan.expected_cost == pytest.approx(2.0)
    assert not start_now(plan, MONDAY + 60)
    assert start_now(plan, MONDAY + 10 * HOUR - 30)


def test_plan_prefers_the_zone_with_cheaper_expected_cost():
    # cheap but rarely available (pays on-demand most of the time) vs dearer but reliable
    profile = _profile(flaky=(0.5, 0.2), steady=(1.0, 1.0))
    plan = plan_start(
        profile, job_hours=2, window_start=MONDAY, window_end=MONDAY + 2 * HOUR, now=MONDAY
    )
    assert plan.zone == "steady" and plan.start_at == MONDAY
    assert plan.expected_cost == pytest.approx(2.0)
    assert "steady" in plan.reason


def test_current_offers_override_the_first_hour():
    profile = _profile(a=(1.0, 1.0), b=(1.2, 1.0))
    pool = Pool("aws", "r", "a", "p3.2xlarge", Market.SPOT)
    gone = Offer(pool, 1.0, 3.0, False, MONDAY)
    plan = plan_start(
        profile,
        job_hours=1,
        window_start=MONDAY,
        window_end=MONDAY + HOUR,
        now=MONDAY,
        current_offers=[gone],
    )
    assert plan.zone == "b"  # zone a has no capacity right now: it would cost on-demand


def test_job_longer_than_window_is_a_config_error():
    with pytest.raises(ConfigError, match="window"):
        plan_start(
            _profile(a=(1.0, 1.0)),
            job_hours=5,
            window_start=MONDAY,
            window_end=MONDAY + 4 * HOUR,
            now=MONDAY,
        )


def test_a_window_that_is_nearly_over_starts_now():
    plan = plan_start(
        _profile(a=(1.0, 1.0)),
        job_hours=4,
        window_start=MONDAY,
        window_end=MONDAY + 5 * HOUR,
        now=MONDAY + 2 * HOUR,
    )
    assert plan.start_at == MONDAY + 2 * HOUR and start_now(plan, MONDAY + 2 * HOUR)
    assert isinstance(plan, StartPlan)


def test_plan_on_real_trace_never_reads_the_future(traces_dir):
    from spot_core.market.trace import load_traces

    traces = load_traces(sorted((traces_dir / "aws-v100-2023-02").glob("us-east-1*.csv")))
    cut = traces[0].start_time + 14 * 86400
    profile = build_profile(traces, until=cut)
    altered = [t.slice(0, int(14 * 86400 / t.tick_seconds) + 1) for t in traces]
    assert build_profile(altered, until=cut) == profile
    plan = plan_start(profile, job_hours=6, window_start=cut, window_end=cut + 24 * HOUR, now=cut)
    assert plan.zone in profile.zones and cut <= plan.start_at <= cut + 18 * HOUR
    assert plan.expected_cost < 6 * 3.06


@pytest.fixture
def traces_dir():
    from tests.support.spot_helpers import TRACES

    return TRACES
