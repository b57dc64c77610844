"""Pool alerts: which pools' interruption rate or spot price passed a threshold.

Pure: the market's offers and per-pool statistics (``Market.offers`` and
``Market.stats``) and the thresholds in, alerts out. The engines raise them their
own way (a Prefect event ``spot.pool.alert`` an automation can trigger on; an Airflow
listener hook) and read the thresholds from ``spot_core.settings``
(``alert_interruption_rate``, ``alert_spot_price``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spot_core.market.base import PoolStat, as_pool_stat
from spot_core.model import Offer, Pool

INTERRUPTION_RATE = "interruption_rate"
SPOT_PRICE = "spot_price"


@dataclass(frozen=True)
class PoolAlert:
    """One threshold one pool passed, at ``observed_at``."""

    pool: Pool
    kind: str  # INTERRUPTION_RATE (per hour on spot) or SPOT_PRICE (USD/h)
    value: float
    threshold: float
    observed_at: float

    @property
    def message(self) -> str:
        if self.kind == INTERRUPTION_RATE:
            return (
                f"{self.pool.key}: {self.value:.3g} interruptions per spot hour, above the "
                f"alert threshold {self.threshold:g} (alert_interruption_rate)"
            )
        return (
            f"{self.pool.key}: spot price ${self.value:.4g}/h, above the alert threshold "
            f"${self.threshold:g}/h (alert_spot_price)"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "pool": self.pool.to_dict(),
            "pool_key": self.pool.key,
            "kind": self.kind,
            "value": self.value,
            "threshold": self.threshold,
            "observed_at": self.observed_at,
            "message": self.message,
        }


def pool_alerts(
    offers: Sequence[Offer],
    stats: Mapping[str, PoolStat | tuple[float, float]] | None = None,
    *,
    max_interruption_rate: float | None,
    max_spot_price: float | None,
) -> list[PoolAlert]:
    """Every spot pool whose observed interruption rate is above ``max_interruption_rate``
    or whose spot price is above ``max_spot_price`` (None: that check is off).

    Only spot pools: on-demand capacity is never reclaimed and its price is the list price.
    A pool with no statistics raises no rate alert (no evidence is not a high rate)."""
    alerts = []
    for offer in offers:
        if not offer.pool.is_spot:
            continue
        stat = (stats or {}).get(offer.pool.key)
        if max_interruption_rate is not None and stat is not None:
            rate = as_pool_stat(stat).interruptions_per_hour
            if rate > max_interruption_rate:
                alerts.append(
                    PoolAlert(
                        offer.pool,
                        INTERRUPTION_RATE,
                        rate,
                        max_interruption_rate,
                        offer.observed_at,
                    )
                )
        if max_spot_price is not None and offer.price_per_hour > max_spot_price:
            alerts.append(
                PoolAlert(
                    offer.pool, SPOT_PRICE, offer.price_per_hour, max_spot_price, offer.observed_at
                )
            )
    return alerts
