"""The EC2 market against moto: price history per type x AZ, on-demand table, advisor
bands, placement scores degrading cleanly, capacity-miss memory; and the EventBridge
event parser."""

from __future__ import annotations

import json
import logging
import time

import pytest

from spot_core.errors import ConfigError
from spot_core.interruption.eventbridge import EventQueue, interruption_event, parse_event
from spot_core.market.advisor import load_advisor
from spot_core.market.ec2 import ON_DEMAND_PRICES, Ec2Market
from spot_core.market.trace import load_spot_price_history
from spot_core.model import JobRecord, Market, Pool
from spot_core.policy.retry import RetryPolicy, decide_next
from tests.support.aws_helpers import client, count_calls

ZONES = ("us-east-1a", "us-east-1b")
TYPES = ("g4dn.xlarge", "g5.xlarge")


@pytest.fixture
def market(aws_env):
    ec2 = client("ec2", aws_env)
    pools = tuple(Pool("aws", "us-east-1", z, t) for z in ZONES for t in TYPES)
    return Ec2Market({"us-east-1": ec2}, pools, load_advisor())


def test_offers_price_each_pool_from_its_own_history(market):
    counts = count_calls(market.clients["us-east-1"])
    requests = []
    market.clients["us-east-1"].meta.events.register(
        "provide-client-params.ec2.DescribeSpotPriceHistory",
        lambda params, **kw: requests.append(dict(params)),
    )
    now = time.time()
    offers = market.offers(market.pools(), now)
    assert len(offers) == 4 and all(o.available for o in offers)
    assert all(o.price_per_hour > 0 and o.observed_at == now for o in offers)
    by_type = {o.pool.instance_type: o for o in offers}
    assert by_type["g5.xlarge"].on_demand_price_per_hour == ON_DEMAND_PRICES["g5.xlarge"]
    assert by_type["g4dn.xlarge"].interruption_band is not None
    assert counts["DescribeSpotPriceHistory"] == 4, "one query per type x zone"
    assert {(r["InstanceTypes"][0], r["AvailabilityZone"]) for r in requests} == {
        (t, z) for z in ZONES for t in TYPES
    }
    assert all(r["ProductDescriptions"] == ["Linux/UNIX"] for r in requests)
    market.offers(market.pools(), now + 5)
    assert counts["DescribeSpotPriceHistory"] == 4, "cached for refresh_seconds"
    on_demand = market.offers(market.pools(Market.ON_DEMAND), now)
    assert all(o.price_per_hour == ON_DEMAND_PRICES[o.pool.instance_type] for o in on_demand)


def test_a_type_without_price_history_in_a_zone_is_not_offered_as_available(aws_env):
    # moto, like AWS, has no p3.2xlarge offering in every us-east-1 zone
    pool = Pool("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
    market = Ec2Market({"us-east-1": client("ec2", aws_env)}, (pool,))
    [offer] = market.offers([pool], time.time())
    assert not offer.available and offer.on_demand_price_per_hour == 3.06


def test_placement_scores_degrade_cleanly_where_the_api_does_not_answer(market, caplog):
    with caplog.at_level(logging.INFO):
        pool = market.pools()[0]
        assert market.placement_score(pool, time.time()) is None
        assert market.placement_score(pool, time.time() + 1000) is None
    assert sum("placement scores unavailable" in r.getMessage() for r in caplog.records) == 1
    assert market.stats(market.pools(), time.time()) == {}


def test_a_capacity_miss_makes_the_pool_unavailable_for_a_while(market):
    now = time.time()
    pool = market.pools()[0]
    market.note_capacity_miss(pool, now)
    assert not market.offers([pool], now + 1)[0].available
    assert market.offers([pool], now + market.capacity_cooldown_seconds + 1)[0].available
    decision = decide_next(
        JobRecord("j", now), market.offers(market.pools(), now + 1), RetryPolicy(), now=now + 1
    )
    assert decision.action == "launch" and pool not in decision.pools


def test_history_document_feeds_the_trace_loader(market):
    now = time.time()
    traces = load_spot_price_history(
        market.history_document(now - 3600, now), tick_seconds=600, end=now, on_demand_price=1.0
    )
    assert {key for key in traces} == {(z, t) for z in ZONES for t in TYPES}


def test_unknown_instance_type_names_the_fix(aws_env):
    pools = (Pool("aws", "us-east-1", "us-east-1a", "x9.mega"),)
    with pytest.raises(ConfigError, match="on_demand_prices"):
        Ec2Market({"us-east-1": client("ec2", aws_env)}, pools)
    priced = Ec2Market(
        {"us-east-1": client("ec2", aws_env)},
        pools,
        on_demand_prices={"us-east-1": {"x9.mega": 9.5}},
    )
    assert priced.on_demand_price("us-east-1", "x9.mega") == 9.5


def test_eventbridge_events_from_sqs(aws_env):
    sqs = client("sqs", aws_env)
    url = sqs.create_queue(QueueName=f"events-{time.time_ns()}")["QueueUrl"]
    at = 1_800_000_000.0
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(interruption_event("i-1", at)))
    sqs.send_message(
        QueueUrl=url, MessageBody=json.dumps(interruption_event("i-2", at, kind="rebalance"))
    )
    sqs.send_message(QueueUrl=url, MessageBody="not json")
    events = sorted(EventQueue(sqs, url).poll(), key=lambda e: e.instance_id)
    assert [(e.instance_id, e.kind, e.at) for e in events] == [
        ("i-1", "interruption", at),
        ("i-2", "rebalance", at),
    ]
    assert events[0].action == "terminate"
    assert EventQueue(sqs, url).poll() == [], "read messages are deleted"
    assert parse_event(json.dumps({"source": "aws.s3", "detail-type": "x"})) is None


def test_price_integration_follows_each_change():
    from spot_core.market.ec2 import integrate_prices

    # 1 h at the price set before the start (0.5), then 30 min at 1.0, then 30 min at 0.2.
    changes = [(-100.0, 0.5), (3600.0, 1.0), (5400.0, 0.2), (9000.0, 9.9)]
    assert integrate_prices(changes, 0.0, 7200.0, initial=7.0) == pytest.approx(0.5 + 0.5 + 0.1)
    assert integrate_prices([], 0.0, 1800.0, initial=0.8) == pytest.approx(0.4)
    assert integrate_prices(changes, 10.0, 10.0, initial=1.0) == 0.0


def test_spot_is_billed_at_the_market_price_not_the_launch_price(market):
    pool = market.pools()[0]
    now = time.time()
    history = market.price_history(
        pool.region, pool.instance_type, pool.zone, start=now - 86400, end=now
    )
    prices = {float(e["SpotPrice"]) for e in history}
    assert len(prices) == 1, "moto serves one price per pool"
    cost = market.spot_cost(pool, now - 3600, now, launch_price=99.0)
    assert cost == pytest.approx(prices.pop())
