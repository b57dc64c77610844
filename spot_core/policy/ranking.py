"""Which spot pool to try first: cheapest once the cost of being interrupted is priced in.

A pool at $0.90/h that is reclaimed twice an hour is dearer than one at $1.00/h that
never is, because every interruption costs a restart overhead plus the work done since
the last checkpoint, billed again. So each offer is ranked by an *effective* price:

    effective = price * (1 + interruptions_per_hour * restart_cost_hours)

The interruption rate comes from what the market observed of the pool (``PoolStat``)
blended with the Spot Advisor band of the offer as a prior, so a pool with little
history is neither trusted blindly nor ignored. Pure: offers, stats and ``now`` in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spot_core.errors import ConfigError
from spot_core.market.advisor import band_for_label
from spot_core.market.base import PoolStat, PoolStats, as_pool_stat
from spot_core.model import Market, Offer
from spot_core.policy.registry import Registry


@dataclass(frozen=True)
class RankingConfig:
    """How to price interruptions and which offers to keep.

    ``restart_cost_hours``: paid hours lost per interruption (restart overhead plus, on
    average, half a checkpoint interval of redone work); 0 ranks by raw price.
    ``prior_weight_hours``: how many hours of observation the advisor prior is worth.
    ``max_offer_age_seconds``: offers observed longer ago than this count as unavailable.
    """

    restart_cost_hours: float = 0.25
    prior_weight_hours: float = 24.0
    default_interruptions_per_hour: float = 0.0
    max_offer_age_seconds: float | None = None
    include_unavailable: bool = False

    def __post_init__(self) -> None:
        for name in ("restart_cost_hours", "prior_weight_hours", "default_interruptions_per_hour"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"RankingConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.max_offer_age_seconds is not None and not self.max_offer_age_seconds > 0:
            raise ConfigError("RankingConfig.max_offer_age_seconds must be > 0 or None")


RANKINGS: Registry[RankingConfig] = Registry("ranking", default="capacity-aware")
RANKINGS.register("capacity-aware", RankingConfig())
RANKINGS.register("cheapest", RankingConfig(restart_cost_hours=0.0))


def prior_rate(offer: Offer, config: RankingConfig) -> float:
    """Interruptions per hour the advisor band implies, before any observation."""
    if offer.interruption_band:
        return band_for_label(offer.interruption_band).interruptions_per_hour
    return config.default_interruptions_per_hour


def interruption_rate(offer: Offer, stat: PoolStat | None, config: RankingConfig) -> float:
    """Observed rate, shrunk towards the prior by how little history backs it."""
    prior = prior_rate(offer, config)
    if stat is None:
        return prior
    if stat.observed_hours is None:
        return stat.interruptions_per_hour
    weight, hours = config.prior_weight_hours, stat.observed_hours
    if weight + hours == 0:
        return prior
    return (prior * weight + stat.interruptions_per_hour * hours) / (weight + hours)


def effective_price(offer: Offer, stat: PoolStat | None, config: RankingConfig) -> float:
    rate = interruption_rate(offer, stat, config)
    return offer.price_per_hour * (1.0 + rate * config.restart_cost_hours)


def is_usable(offer: Offer, now: float, config: RankingConfig) -> bool:
    """Available, and not so old that its ``available`` flag may no longer hold."""
    age = config.max_offer_age_seconds
    return offer.available and (age is None or now - offer.observed_at <= age)


def rank_pools(
    offers: Sequence[Offer],
    stats: PoolStats | None = None,
    *,
    now: float,
    config: RankingConfig | None = None,
    market: Market | None = Market.SPOT,
) -> tuple[Offer, ...]:
    """Offers on ``market`` (None: all), best first; unusable ones dropped or put last.

    Ties break on higher observed availability, then pool key, so the order is stable.
    """
    config = config or RANKINGS.get()
    table = {key: as_pool_stat(value) for key, value in (stats or {}).items()}
    chosen = [o for o in offers if market is None or o.pool.market is market]
    if not config.include_unavailable:
        chosen = [o for o in chosen if is_usable(o, now, config)]

    def key(offer: Offer) -> tuple[bool, float, float, str]:
        stat = table.get(offer.pool.key)
        availability = 0.0 if stat is None else stat.availability
        return (
            not is_usable(offer, now, config),
            effective_price(offer, stat, config),
            -availability,
            offer.pool.key,
        )

    return tuple(sorted(chosen, key=key))
