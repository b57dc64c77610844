"""Prices and availability of capacity: trace replay, EC2 price history, Spot Advisor.

Everything a policy needs from a market arrives as ``Offer`` records (``spot_core.model``)
and ``PoolStat`` observations; the ``Market`` protocol here is the source of offers (not
to be confused with the ``spot_core.model.Market`` enum of spot | on-demand).
"""

from spot_core.market.advisor import Band, SpotAdvisor, band_for_label, load_advisor
from spot_core.market.base import Market, PoolStat, PoolStats
from spot_core.market.fixtures import (
    default_json_trace,
    default_traces,
    fixture_json_trace_path,
    fixture_prices_path,
    fixture_trace_paths,
)
from spot_core.market.trace import ZoneTrace, load_spot_price_history, load_trace, load_traces
from spot_core.market.trace_market import TraceMarket

__all__ = [
    "Band",
    "Market",
    "PoolStat",
    "PoolStats",
    "SpotAdvisor",
    "TraceMarket",
    "ZoneTrace",
    "band_for_label",
    "default_json_trace",
    "default_traces",
    "fixture_json_trace_path",
    "fixture_prices_path",
    "fixture_trace_paths",
    "load_advisor",
    "load_spot_price_history",
    "load_trace",
    "load_traces",
]
