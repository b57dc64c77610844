"""Pool alerts: a spot pool past the interruption-rate or price threshold raises one alert
each; on-demand pools and checks that are off raise none (a table of cases)."""

from __future__ import annotations

import pytest

from spot_core.errors import ConfigError
from spot_core.market.base import PoolStat
from spot_core.model import Market, Offer, Pool
from spot_core.policy.alerts import INTERRUPTION_RATE, SPOT_PRICE, pool_alerts
from spot_core.settings import SpotSettings

A = Pool("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
B = Pool("aws", "us-east-1", "us-east-1b", "p3.2xlarge")


def offer(pool: Pool, price: float) -> Offer:
    return Offer(pool, price, 3.06, True, 100.0)


CASES = [
    # offers, stats, rate threshold, price threshold, expected (zone, kind)
    (
        [offer(A, 0.9)],
        {A.key: PoolStat(1.0, 0.5, 24.0)},
        0.25,
        None,
        [("us-east-1a", INTERRUPTION_RATE)],
    ),
    ([offer(A, 0.9)], {A.key: PoolStat(1.0, 0.25, 24.0)}, 0.25, None, []),  # at: no alert
    ([offer(A, 0.9), offer(B, 1.2)], {}, None, 1.0, [("us-east-1b", SPOT_PRICE)]),
    (
        [offer(A, 1.9)],
        {A.key: (0.4, 2.0)},
        0.25,
        1.0,
        [("us-east-1a", INTERRUPTION_RATE), ("us-east-1a", SPOT_PRICE)],
    ),
    ([offer(A, 9.0)], {A.key: (1.0, 9.0)}, None, None, []),  # both checks off
    ([offer(A, 0.9)], {}, 0.25, None, []),  # no statistics: no evidence
    (
        [offer(A.on(Market.ON_DEMAND), 3.06)],
        {A.on(Market.ON_DEMAND).key: (1.0, 5.0)},
        0.25,
        1.0,
        [],
    ),  # on-demand is never alerted
]


@pytest.mark.parametrize("offers, stats, rate, price, expected", CASES)
def test_pool_alerts(offers, stats, rate, price, expected):
    alerts = pool_alerts(offers, stats, max_interruption_rate=rate, max_spot_price=price)
    assert [(a.pool.zone, a.kind) for a in alerts] == expected
    for alert in alerts:
        assert alert.value > alert.threshold and alert.pool.zone in alert.message
        assert alert.to_dict()["pool_key"] == alert.pool.key


def test_thresholds_are_settings_with_one_line_errors():
    settings = SpotSettings.build(alert_interruption_rate=0.5, alert_spot_price=1.2)
    assert settings.alert_thresholds() == {"max_interruption_rate": 0.5, "max_spot_price": 1.2}
    assert SpotSettings.build().alert_thresholds() == {
        "max_interruption_rate": 0.25,
        "max_spot_price": None,
    }
    with pytest.raises(
        ConfigError, match=r"^alert_spot_price=-1 must be > 0 USD/h and at most 1,000$"
    ):
        SpotSettings.build(alert_spot_price=-1)
