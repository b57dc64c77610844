"""What a market is to the rest of the system: something that prices pools at a moment.

Policies and providers consume markets only through these small protocols, so the
trace-replay market, the EC2 price-history market and any future one are
interchangeable. ``PoolStat`` is the observation a market may add on top of offers:
how often a pool had capacity and how often it took it away, over a look-back window.

Naming note: ``spot_core.model.Market`` is the *enum* (spot | on-demand); the protocol
here is the *source of offers*. Import this module as ``market_base`` where both meet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from spot_core.errors import ConfigError
from spot_core.model import Offer, Pool


class PoolStat(NamedTuple):
    """Observed behaviour of one pool over a look-back window that ends at ``now``.

    A plain ``(availability, interruptions_per_hour)`` tuple is accepted wherever a
    ``PoolStat`` is, so tests and callers can write stats tables by hand.
    ``observed_hours`` says how much history the numbers rest on (None: unknown, trust
    them fully); ranking uses it to weigh them against an advisor prior.
    """

    availability: float
    interruptions_per_hour: float
    observed_hours: float | None = None


PoolStats = Mapping[str, "PoolStat | tuple[float, float]"]


def as_pool_stat(value: PoolStat | Sequence[float]) -> PoolStat:
    """Normalise a hand-written tuple into a validated ``PoolStat``."""
    stat = PoolStat(*value)
    if not 0.0 <= stat.availability <= 1.0 or math.isnan(stat.availability):
        raise ConfigError(f"availability must be within [0, 1], got {stat.availability}")
    if not stat.interruptions_per_hour >= 0.0:
        raise ConfigError(f"interruptions_per_hour must be >= 0, got {stat.interruptions_per_hour}")
    return stat


@runtime_checkable
class Market(Protocol):
    """A source of offers: price and capacity of each pool at wall-clock time ``now``, and
    what it has seen of each pool. Every market declares its clock: ``time_scale``,
    capacity seconds per wall second (1 but for a trace replayed faster), and
    ``tick_seconds``, the capacity seconds between its changes (None: no tick clock)."""

    @property
    def time_scale(self) -> float: ...

    @property
    def tick_seconds(self) -> float | None: ...

    def offers(self, pools: Sequence[Pool], now: float) -> list[Offer]:
        """One offer per pool it knows; pools it cannot price raise ``ConfigError``."""

    def stats(self, pools: Sequence[Pool], now: float) -> dict[str, PoolStat]:
        """``pool.key -> PoolStat`` over the market's look-back window ending at ``now``,
        for the pools it has seen (none, for a market that keeps no history)."""
