"""The EC2 market: live spot prices, shipped on-demand prices, advisor bands, placement scores.

Feeds the same policies as the trace market (``offers`` and ``stats``):

- spot price: ``describe_spot_price_history``, paginated, one query per instance type x
  availability zone, ``Linux/UNIX`` only; the newest price at or before ``now`` wins.
  Results are cached for ``refresh_seconds`` so a controller polling every few seconds
  does not turn into a price-history storm.
- on-demand price: ``ON_DEMAND_PRICES`` below (us-east-1 Linux list prices of common GPU
  and CPU types), overridable per type or per region and type. The Pricing API is not
  used: it lives in two regions only and needs its own IAM action.
- interruption band: the Spot Advisor feed (``load_advisor``; the shipped excerpt, or a
  refreshed copy the user points at with ``advisor_path``).
- spot placement scores (``get_spot_placement_scores``, 1-10 per AZ) where the API
  answers. Where it does not (an emulator, a partition without it, a role without
  ``ec2:GetSpotPlacementScores``) the market logs once and carries on without them.

A pool the provider just failed to launch in (``note_capacity_miss``) is offered as
unavailable for ``capacity_cooldown_seconds``; EC2 has no "is there capacity" call, so
that memory and the placement score are all a market can know before launching.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from spot_core.errors import ConfigError, SpotError
from spot_core.market.advisor import Band, SpotAdvisor, load_advisor
from spot_core.market.base import PoolStat
from spot_core.model import Market, Offer, Pool

log = logging.getLogger(__name__)

PRODUCT = "Linux/UNIX"
PRODUCTS = (PRODUCT, "Linux/UNIX (Amazon VPC)")  # the second is the same product, older name

ON_DEMAND_PRICES: Mapping[str, float] = {
    # GPU (us-east-1, Linux, $/h)
    "p3.2xlarge": 3.06,
    "p3.8xlarge": 12.24,
    "p3.16xlarge": 24.48,
    "p4d.24xlarge": 32.7726,
    "p5.48xlarge": 55.04,
    "g4dn.xlarge": 0.526,
    "g4dn.2xlarge": 0.752,
    "g4dn.4xlarge": 1.204,
    "g4dn.12xlarge": 3.912,
    "g5.xlarge": 1.006,
    "g5.2xlarge": 1.212,
    "g5.4xlarge": 1.624,
    "g5.12xlarge": 5.672,
    "g5.48xlarge": 16.288,
    "g6.xlarge": 0.8048,
    "g6.2xlarge": 0.9776,
    "g6e.xlarge": 1.861,
    # CPU
    "t3.medium": 0.0416,
    "t3.large": 0.0832,
    "m5.large": 0.096,
    "m5.xlarge": 0.192,
    "m5.2xlarge": 0.384,
    "m6i.large": 0.096,
    "m6i.xlarge": 0.192,
    "m6i.2xlarge": 0.384,
    "c5.large": 0.085,
    "c5.xlarge": 0.17,
    "c5.2xlarge": 0.34,
    "c6i.xlarge": 0.17,
    "c6i.2xlarge": 0.34,
    "r5.xlarge": 0.252,
    "r5.2xlarge": 0.504,
}
"""On-demand list prices (us-east-1, Linux/UNIX). Other regions differ by a few percent;
pass ``on_demand_prices={"eu-west-1": {"g5.xlarge": 1.123}}`` for exact figures."""

PLACEMENT_SCORE_MAX = 10


@dataclass
class Ec2Market:
    """Offers for EC2 pools from live price history; ``clients`` maps region -> EC2 client."""

    clients: Mapping[str, Any]
    pools_offered: tuple[Pool, ...]
    advisor: SpotAdvisor | None = None
    on_demand_prices: Mapping[str, Any] = field(default_factory=dict)
    refresh_seconds: float = 300.0
    history_hours: float = 6.0
    capacity_cooldown_seconds: float = 120.0
    use_placement_scores: bool = True
    clock: Any = time.time
    time_scale: float = 1.0  # EC2 runs in real time; the trace market's is faster
    tick_seconds: float | None = None  # prices change whenever EC2 says, on no tick

    def __post_init__(self) -> None:
        self._prices: dict[tuple[str, str, str], float] = {}
        self._fetched_at: dict[tuple[str, str, str], float] = {}
        self._scores: dict[tuple[str, str, str], int] = {}
        self._scores_at: dict[str, float] = {}
        self._scores_supported = self.use_placement_scores
        self._misses: dict[str, float] = {}
        for pool in self.pools_offered:
            self.on_demand_price(pool.region, pool.instance_type)  # fail early on unknown types

    # -- the Market protocol -------------------------------------------------------------
    def pools(self, market: Market = Market.SPOT) -> tuple[Pool, ...]:
        return tuple(p.on(market) for p in self.pools_offered)

    def offers(self, pools: Sequence[Pool], now: float) -> list[Offer]:
        return [self._offer(pool, now) for pool in pools]

    def stats(self, pools: Sequence[Pool], now: float) -> dict[str, PoolStat]:
        """Placement score as availability, advisor band as interruption rate (a prior:
        ``observed_hours=0`` so ranking weighs it as such)."""
        out = {}
        for pool in pools:
            score = self.placement_score(pool, now)
            band = self._band(pool)
            rate = band.interruptions_per_hour if band else 0.0
            if score is not None:
                out[pool.key] = PoolStat(score / PLACEMENT_SCORE_MAX, rate, 0.0)
        return out

    def _offer(self, pool: Pool, now: float) -> Offer:
        on_demand = self.on_demand_price(pool.region, pool.instance_type)
        band = self._band(pool)
        if not pool.is_spot:
            return Offer(pool, on_demand, on_demand, True, now)
        price = self.spot_price(pool.region, pool.zone, pool.instance_type, now)
        missed = now - self._misses.get(pool.key, -math.inf) < self.capacity_cooldown_seconds
        score = self.placement_score(pool, now)
        available = price is not None and not missed and (score is None or score > 1)
        return Offer(
            pool,
            on_demand if price is None else price,
            on_demand,
            available,
            now,
            interruption_band=None if band is None else band.label,
        )

    def _band(self, pool: Pool) -> Band | None:
        if self.advisor is None:
            return None
        return self.advisor.find_band(pool.region, pool.instance_type)

    # -- what the provider tells the market ------------------------------------------------
    def note_capacity_miss(self, pool: Pool, now: float | None = None) -> None:
        self._misses[pool.key] = self.clock() if now is None else now

    # -- prices ----------------------------------------------------------------------------
    def on_demand_price(self, region: str, instance_type: str) -> float:
        regional = self.on_demand_prices.get(region)
        if isinstance(regional, Mapping) and instance_type in regional:
            return float(regional[instance_type])
        if isinstance(self.on_demand_prices.get(instance_type), (int, float)):
            return float(self.on_demand_prices[instance_type])
        if instance_type in ON_DEMAND_PRICES:
            return ON_DEMAND_PRICES[instance_type]
        raise ConfigError(
            f"no on-demand price known for {instance_type}; pass "
            f"on_demand_prices={{'{instance_type}': PRICE_PER_HOUR}}"
        )

    def spot_price(self, region: str, zone: str, instance_type: str, now: float) -> float | None:
        key = (region, zone, instance_type)
        if now - self._fetched_at.get(key, -math.inf) >= self.refresh_seconds:
            try:
                history = self.price_history(
                    region, instance_type, zone, start=now - self.history_hours * 3600, end=now
                )
            except SpotError as exc:
                log.warning(
                    "spot price history for %s %s unavailable: %s", zone, instance_type, exc
                )
                history = []
            self._fetched_at[key] = now
            if history:
                self._prices[key] = float(max(history, key=_timestamp)["SpotPrice"])
        return self._prices.get(key)

    def price_history(
        self, region: str, instance_type: str, zone: str, *, start: float, end: float
    ) -> list[dict[str, Any]]:
        """Every ``Linux/UNIX`` price change of one type in one AZ between start and end."""
        from spot_core.adaptors import aws

        paginator = self.clients[region].get_paginator("describe_spot_price_history")
        pages = aws.call(
            f"ec2:DescribeSpotPriceHistory {zone} {instance_type}",
            lambda: list(
                paginator.paginate(
                    InstanceTypes=[instance_type],
                    AvailabilityZone=zone,
                    ProductDescriptions=[PRODUCT],
                    StartTime=_utc(start),
                    EndTime=_utc(end),
                )
            ),
        )
        return [
            entry
            for page in pages
            for entry in page.get("SpotPriceHistory", [])
            if entry.get("ProductDescription", PRODUCT) in PRODUCTS
            and entry.get("AvailabilityZone", zone) == zone
        ]

    def spot_cost(self, pool: Pool, start: float, end: float, launch_price: float) -> float:
        """Dollars for a spot instance held from ``start`` to ``end``, at the price in effect
        each second (EC2 bills spot per second at the current price, not the launch price).
        Without history (an API error, an emulator's empty answer) the launch price holds."""
        try:
            history = self.price_history(
                pool.region, pool.instance_type, pool.zone, start=start, end=end
            )
        except SpotError as exc:
            log.warning(
                "spot price history for %s unavailable, billing at the launch price: %s",
                pool.key,
                exc,
            )
            history = []
        changes = [(_timestamp(e), float(e["SpotPrice"])) for e in history]
        return integrate_prices(changes, start, end, launch_price)

    def history_document(self, start: float, end: float) -> dict[str, list[dict[str, Any]]]:
        """All offered pools' history as one ``describe_spot_price_history``-shaped document,
        ready for ``load_spot_price_history`` (the simulator's input)."""
        entries = []
        for pool in self.pools_offered:
            entries += self.price_history(
                pool.region, pool.instance_type, pool.zone, start=start, end=end
            )
        return {
            "SpotPriceHistory": [
                {**e, "Timestamp": _timestamp(e), "ProductDescription": PRODUCT} for e in entries
            ]
        }

    # -- placement scores -----------------------------------------------------------------
    def placement_score(self, pool: Pool, now: float) -> int | None:
        if not self._scores_supported:
            return None
        if now - self._scores_at.get(pool.region, -math.inf) >= self.refresh_seconds:
            self._scores_at[pool.region] = now
            self._fetch_scores(pool.region)
        return self._scores.get((pool.region, pool.zone, pool.instance_type))

    def _fetch_scores(self, region: str) -> None:
        """One query per type (scores are per type set); degrade for good on any refusal."""
        from spot_core.adaptors import aws

        types = sorted({p.instance_type for p in self.pools_offered if p.region == region})
        zones = {p.zone for p in self.pools_offered if p.region == region}
        client = self.clients[region]
        for instance_type in types:
            try:
                answer = aws.call_raw(
                    client.get_spot_placement_scores,
                    InstanceTypes=[instance_type],
                    TargetCapacity=1,
                    SingleAvailabilityZone=True,
                    RegionNames=[region],
                )
            except Exception as exc:  # noqa: BLE001 - not implemented, not allowed, not in this partition
                self._scores_supported = False
                log.info(
                    "spot placement scores unavailable (%s); ranking without them",
                    aws.error_code(exc) or type(exc).__name__,
                )
                return
            for entry in answer.get("SpotPlacementScores", []):
                zone = entry.get("AvailabilityZone") or _zone_of(entry, zones)
                if zone in zones:
                    self._scores[(region, zone, instance_type)] = int(entry["Score"])


def integrate_prices(
    changes: Sequence[tuple[float, float]], start: float, end: float, initial: float
) -> float:
    """Dollars over [start, end] of a $/h step function: ``initial`` until the first change,
    then each ``(time, price)`` from its time on (changes before ``start`` set the price
    in effect at ``start``)."""
    if end <= start:
        return 0.0
    ordered = sorted(changes)
    price = initial
    for at, value in ordered:
        if at <= start:
            price = value
    total, cursor = 0.0, start
    for at, value in ordered:
        if start < at < end:
            total += price * (at - cursor)
            cursor, price = at, value
    return (total + price * (end - cursor)) / 3600.0


def _zone_of(entry: Mapping[str, Any], zones: set[str]) -> str | None:
    """Scores name AZ ids (use1-az1) unless the caller's zone names resolve; best effort."""
    return entry.get("AvailabilityZoneId") if entry.get("AvailabilityZoneId") in zones else None


def _timestamp(entry: Mapping[str, Any]) -> float:
    value = entry["Timestamp"]
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return float(value)


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def load_ec2_advisor(path: str | None = None) -> SpotAdvisor:
    """The advisor feed: ``path`` (a refreshed spot-advisor-data.json) or the shipped excerpt."""
    return load_advisor(path)
