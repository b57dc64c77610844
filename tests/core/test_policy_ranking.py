"""Pool ranking: cheapest first once interruptions are priced in; unusable pools dropped."""

from __future__ import annotations

import pytest

from spot_core.errors import ConfigError
from spot_core.market.advisor import band_for_label
from spot_core.market.base import PoolStat
from spot_core.model import Market, Offer, Pool
from spot_core.policy.ranking import (
    RANKINGS,
    RankingConfig,
    effective_price,
    interruption_rate,
    rank_pools,
)

NOW = 1_700_000_000.0


def pool(zone: str, market: Market = Market.SPOT) -> Pool:
    return Pool("aws", zone[:-1], zone, "p3.2xlarge", market)


def offer(
    zone: str,
    price: float,
    available: bool = True,
    band: str | None = None,
    market: Market = Market.SPOT,
    age: float = 0.0,
) -> Offer:
    return Offer(pool(zone, market), price, 3.06, available, NOW - age, interruption_band=band)


def key(zone: str, market: Market = Market.SPOT) -> str:
    return pool(zone, market).key


A, B, C = "us-east-1a", "us-east-1b", "us-east-1c"
CAPACITY_AWARE = RANKINGS.get("capacity-aware")
CHEAPEST = RANKINGS.get("cheapest")

CASES = [
    # (name, offers, stats, config, expected zone order)
    (
        "cheapest first without stats",
        [offer(A, 1.0), offer(B, 0.9), offer(C, 1.1)],
        None,
        CAPACITY_AWARE,
        [B, A, C],
    ),
    (
        "unavailable pools are dropped",
        [offer(A, 1.0), offer(B, 0.9, available=False), offer(C, 1.1)],
        None,
        CAPACITY_AWARE,
        [A, C],
    ),
    (
        "unavailable pools last when kept",
        [offer(A, 1.0), offer(B, 0.9, available=False), offer(C, 1.1)],
        None,
        RankingConfig(include_unavailable=True),
        [A, C, B],
    ),
    (
        "a flaky cheap pool loses to a steady one",  # 0.9 * (1 + 2 * 0.25) = 1.35 > 1.0
        [offer(A, 1.0), offer(B, 0.9)],
        {key(A): (0.9, 0.0), key(B): (0.9, 2.0)},
        CAPACITY_AWARE,
        [A, B],
    ),
    (
        "raw price when interruptions are free",
        [offer(A, 1.0), offer(B, 0.9)],
        {key(A): (0.9, 0.0), key(B): (0.9, 2.0)},
        CHEAPEST,
        [B, A],
    ),
    (
        "a mildly flaky cheap pool still wins",  # 0.9 * (1 + 0.2 * 0.25) = 0.945 < 1.0
        [offer(A, 1.0), offer(B, 0.9)],
        {key(B): (0.9, 0.2)},
        CAPACITY_AWARE,
        [B, A],
    ),
    (
        "advisor band as the prior",
        [offer(A, 1.0, band=">20%"), offer(B, 1.0, band="<5%")],
        None,
        CAPACITY_AWARE,
        [B, A],
    ),
    (
        "ties break on observed availability",
        [offer(A, 1.0), offer(B, 1.0)],
        {key(A): (0.5, 0.0), key(B): (0.8, 0.0)},
        CAPACITY_AWARE,
        [B, A],
    ),
    (
        "then on pool key",
        [offer(C, 1.0), offer(B, 1.0), offer(A, 1.0)],
        None,
        CAPACITY_AWARE,
        [A, B, C],
    ),
    (
        "stale offers are not trusted",
        [offer(A, 1.0, age=120.0), offer(B, 1.1, age=10.0)],
        None,
        RankingConfig(max_offer_age_seconds=60.0),
        [B],
    ),
    (
        "on-demand offers are not spot candidates",
        [offer(A, 3.06, market=Market.ON_DEMAND), offer(B, 1.1)],
        None,
        CAPACITY_AWARE,
        [B],
    ),
    ("nothing available", [offer(A, 1.0, available=False)], None, CAPACITY_AWARE, []),
]


@pytest.mark.parametrize("name,offers,stats,config,expected", CASES, ids=[c[0] for c in CASES])
def test_rank_pools(name, offers, stats, config, expected):
    ranked = rank_pools(offers, stats, now=NOW, config=config)
    assert [o.pool.zone for o in ranked] == expected
    assert isinstance(ranked, tuple)


def test_all_markets_when_asked():
    offers = [offer(A, 3.06, market=Market.ON_DEMAND), offer(B, 1.1)]
    ranked = rank_pools(offers, now=NOW, market=None)
    assert [o.pool.market for o in ranked] == [Market.SPOT, Market.ON_DEMAND]


@pytest.mark.parametrize(
    "stat,band,expected",
    [
        (None, None, 0.0),  # nothing known: no penalty
        (None, "10-15%", band_for_label("10-15%").interruptions_per_hour),  # prior only
        (PoolStat(0.9, 0.5), "10-15%", 0.5),  # unknown history length: trust it
        (PoolStat(0.9, 0.5, 24.0), None, 0.25),  # 24 h against a 24 h zero prior
        (PoolStat(0.9, 0.5, 72.0), None, 0.375),  # more history, more weight
        (PoolStat(0.9, 0.5, 0.0), None, 0.0),  # no history yet: the prior
    ],
)
def test_interruption_rate_blends_observation_with_prior(stat, band, expected):
    rate = interruption_rate(offer(A, 1.0, band=band), stat, CAPACITY_AWARE)
    assert rate == pytest.approx(expected)


def test_effective_price_formula():
    # 1.2 $/h, 0.8 interruptions/h, 0.25 h lost per interruption -> 1.2 * 1.2 = 1.44
    assert effective_price(offer(A, 1.2), PoolStat(0.5, 0.8), CAPACITY_AWARE) == pytest.approx(1.44)


def test_stats_must_be_sane():
    with pytest.raises(ValueError):
        rank_pools([offer(A, 1.0)], {key(A): (1.5, 0.0)}, now=NOW)


@pytest.mark.parametrize(
    "kwargs",
    [{"restart_cost_hours": -1}, {"prior_weight_hours": -0.1}, {"max_offer_age_seconds": 0}],
)
def test_bad_config(kwargs):
    with pytest.raises(ConfigError):
        RankingConfig(**kwargs)


def test_registry():
    assert RANKINGS.get() is CAPACITY_AWARE
    assert RANKINGS.names() == ["capacity-aware", "cheapest"]
    with pytest.raises(ConfigError, match="choose one of capacity-aware, cheapest"):
        RANKINGS.get("fastest")
