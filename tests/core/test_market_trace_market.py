"""TraceMarket: wall clock -> tick, offers per pool, next flip, and look-back-only statistics."""

from __future__ import annotations

import numpy as np
import pytest

from spot_core.errors import ConfigError
from spot_core.market import Market as MarketProtocol
from spot_core.market import TraceMarket, ZoneTrace, default_traces, load_advisor
from spot_core.model import Market, Pool

ORIGIN = 1_000_000.0


def _trace(flags: str, name: str = "us-east-1a_v100_1", tick: float = 100.0) -> ZoneTrace:
    available = np.array([c == "1" for c in flags])
    prices = 1.0 + 0.1 * np.arange(available.size)
    return ZoneTrace(name, tick, available, prices, 3.06, None, "test")


def _market(flags: str = "1100111000", **kw) -> TraceMarket:
    return TraceMarket([_trace(flags)], tick_origin=ORIGIN, **kw)


SPOT = Pool("aws", "us-east-1", "us-east-1a", "p3.2xlarge")


def test_trace_market_satisfies_the_protocols():
    market = _market()
    assert isinstance(market, MarketProtocol)  # offers, stats and its clock


@pytest.mark.parametrize(
    "now,scale,tick",
    [
        (ORIGIN - 50, 1.0, 0),  # before the origin: the first tick
        (ORIGIN, 1.0, 0),
        (ORIGIN + 99.9, 1.0, 0),
        (ORIGIN + 100, 1.0, 1),
        (ORIGIN + 250, 1.0, 2),
        (ORIGIN + 10, 10.0, 1),  # ten times faster than real time
        (ORIGIN + 0.3, 1000.0, 3),
    ],
)
def test_tick_at_maps_wall_clock_to_ticks(now, scale, tick):
    assert _market(time_scale=scale).tick_at(now) == tick


@pytest.mark.parametrize("tick,available,price", [(0, True, 1.0), (2, False, 1.2), (4, True, 1.4)])
def test_offers_follow_the_trace(tick, available, price):
    market = _market()
    now = market.wall_time(tick) + 1
    spot, od = market.offers([SPOT, SPOT.on(Market.ON_DEMAND)], now)
    assert (spot.available, spot.price_per_hour, spot.on_demand_price_per_hour) == (
        available,
        pytest.approx(price),
        3.06,
    )
    assert (od.available, od.price_per_hour) == (True, 3.06)  # on-demand never runs out
    assert spot.observed_at == now and od.pool.market is Market.ON_DEMAND
    assert market.is_available("us-east-1a", now) is available
    assert market.price("us-east-1a_v100_1", now) == pytest.approx(price)


def test_wrap_replays_from_the_start_and_hold_keeps_the_last_tick():
    wrapping, holding = _market(), _market(wrap=False)
    late = ORIGIN + 12 * 100 + 1  # tick 12 = tick 2 of the second pass
    assert wrapping.is_available("us-east-1a", late) is False
    assert holding.is_available("us-east-1a", late) is False  # last tick "0"
    assert wrapping.is_available("us-east-1a", ORIGIN + 10 * 100) is True


@pytest.mark.parametrize(
    "flags,now_tick,expected_tick,wrap",
    [
        ("1100111000", 0, 2, True),  # available until tick 2
        ("1100111000", 2, 4, True),  # unavailable until tick 4
        ("1100111000", 7, 10, True),  # wraps: tick 10 is tick 0 again (available)
        ("1100111000", 7, None, False),  # never changes again without wrapping
        ("1111", 1, None, True),  # never changes at all
    ],
)
def test_next_change(flags, now_tick, expected_tick, wrap):
    market = _market(flags, wrap=wrap)
    got = market.next_change("us-east-1a", market.wall_time(now_tick) + 5)
    assert got == (None if expected_tick is None else market.wall_time(expected_tick))


def test_next_change_in_wall_clock_with_time_scale():
    market = _market(time_scale=100.0)
    assert market.next_change("us-east-1a", ORIGIN) == ORIGIN + 2.0  # 200 trace s / 100


def test_observed_stats_look_back_only():
    flags = "1111000011110000"
    market = TraceMarket([_trace(flags)], ORIGIN, lookback_hours=0.4)  # 14.4 ticks -> 14
    stat = market.observed("us-east-1a", market.wall_time(7))
    # ticks 0..7 seen: 11110000 -> one preemption in 8 ticks (800 s)
    assert stat.availability == pytest.approx(0.5)
    assert stat.interruptions_per_hour == pytest.approx(1 / (800 / 3600))
    assert stat.observed_hours == pytest.approx(800 / 3600)
    # the future (ticks 8..) must not change what is seen at tick 7
    changed = TraceMarket([_trace("1111000000000000")], ORIGIN, lookback_hours=0.4)
    assert changed.observed("us-east-1a", changed.wall_time(7)) == stat


def test_observed_window_is_bounded():
    market = TraceMarket([_trace("10" * 50)], ORIGIN, lookback_hours=1000 / 3600)  # 10 ticks
    stat = market.observed("us-east-1a", market.wall_time(60))
    assert stat.observed_hours == pytest.approx(1000 / 3600)
    assert stat.availability == pytest.approx(0.5)
    # ticks 51..60 read 0101010101: four 1 -> 0 transitions inside the window
    assert stat.interruptions_per_hour == pytest.approx(4 / (1000 / 3600))


def test_stats_per_pool_key():
    market = TraceMarket(default_traces(), ORIGIN)
    pools = market.pools() + market.pools(Market.ON_DEMAND)
    stats = market.stats(pools, ORIGIN + 24 * 3600)
    assert set(stats) == {p.key for p in pools}
    od = pools[-1]
    assert stats[od.key].availability == 1.0 and stats[od.key].interruptions_per_hour == 0.0


def test_pools_are_named_after_the_traces():
    market = TraceMarket(default_traces(), ORIGIN)
    assert [p.key for p in market.pools()] == [
        "aws/us-east-1/us-east-1d/p3.2xlarge/spot",
        "aws/us-east-2/us-east-2a/p3.2xlarge/spot",
        "aws/us-west-2/us-west-2b/p3.2xlarge/spot",
    ]


def test_replay_matches_the_trace_tick_by_tick():
    traces = default_traces()
    market = TraceMarket(traces, ORIGIN, time_scale=60.0)
    pools = market.pools()
    for tick in range(0, traces[0].n_ticks, 7):
        now = market.wall_time(tick) + 0.5 * traces[0].tick_seconds / 60.0
        for trace, offer in zip(traces, market.offers(pools, now), strict=True):
            assert offer.available == trace.available[tick]
            assert offer.price_per_hour == trace.spot_price[tick]


def test_advisor_band_is_attached_to_spot_offers():
    market = TraceMarket(default_traces(), ORIGIN, advisor=load_advisor())
    offers = market.offers(market.pools(), ORIGIN)
    assert {o.interruption_band for o in offers} == {">20%"}


def test_unknown_zone_is_a_config_error():
    market = _market()
    with pytest.raises(ConfigError, match="no trace for zone 'eu-west-1a'"):
        market.offers([Pool("aws", "eu-west-1", "eu-west-1a", "p3.2xlarge")], ORIGIN)


def test_on_demand_in_another_zone_of_a_traced_region_is_priced():
    market = _market()
    pool = Pool("aws", "us-east-1", "us-east-1b", "p3.2xlarge", Market.ON_DEMAND)
    (offer,) = market.offers([pool], ORIGIN)
    assert offer.available and offer.price_per_hour == 3.06


@pytest.mark.parametrize("kwargs", [{"time_scale": 0}, {"lookback_hours": -1}])
def test_bad_parameters(kwargs):
    with pytest.raises(ConfigError):
        TraceMarket([_trace("1")], ORIGIN, **kwargs)


def test_needs_traces_with_one_tick_length():
    with pytest.raises(ConfigError, match="tick lengths"):
        TraceMarket([_trace("1"), _trace("1", "us-east-1b_v100_1", tick=600)], ORIGIN)
