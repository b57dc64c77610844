"""Pool alerts for Prefect: after each launch and each preemption, the pool involved is
checked against the alert thresholds (``alert_interruption_rate``, ``alert_spot_price``)
with the market's own numbers; a pool past one raises ``spot.pool.alert`` (see
``prefect_spot.events``), once per pool and threshold per job, for an automation to act
on (notify, pause a deployment, narrow a work pool's zones)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from prefect_spot.events import emit_pool_alerts
from spot_core.model import JobRecord
from spot_core.policy.alerts import pool_alerts

log = logging.getLogger(__name__)

CHECKED_AFTER = ("launched", "preempted")


class PoolAlerts:
    """A controller listener that reads the market (I/O here) and lets the pure
    ``pool_alerts`` decide."""

    def __init__(
        self,
        market,
        *,
        max_interruption_rate: float | None,
        max_spot_price: float | None,
        related: Sequence[dict[str, str]] = (),
    ) -> None:
        self.market = market
        self.thresholds = {
            "max_interruption_rate": max_interruption_rate,
            "max_spot_price": max_spot_price,
        }
        self.related = list(related)
        self._raised: set[tuple[str, str]] = set()

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in self.thresholds.values())

    def __call__(self, kind: str, record: JobRecord, detail: str = "") -> None:
        if kind not in CHECKED_AFTER or not record.attempts or not self.enabled:
            return
        pool = record.attempts[-1].pool
        if not pool.is_spot:
            return
        try:
            now = time.time()
            offers = self.market.offers([pool], now)
            stats = self.market.stats([pool], now)
        except Exception:  # noqa: BLE001 - a market outage must not fail the job
            log.warning("could not read the market for pool alerts on %s", pool.key, exc_info=True)
            return
        fresh = [
            a
            for a in pool_alerts(offers, stats, **self.thresholds)
            if (a.pool.key, a.kind) not in self._raised
        ]
        self._raised.update((a.pool.key, a.kind) for a in fresh)
        emit_pool_alerts(fresh, record, self.related)
