"""Pool alerts from an Airflow task: the market's view of the job's pools, the pure check
(``spot_core.policy.alerts.pool_alerts``), then Airflow's listener hook ``on_spot_alert``
(``airflow_spot.listeners.spec``) and the operator's ``on_spot_alert`` callback.

Run once per attempt end, from the record's persist callback (``airflow_spot.records``),
in the process that persisted it (the worker). Reading the market is I/O at the edge; an
unreachable market or a failing listener is logged and never fails the job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from spot_core.model import Attempt, JobRecord, Pool
from spot_core.policy.alerts import PoolAlert, pool_alerts

log = logging.getLogger(__name__)
AlertCallback = Callable[[dict, Any], None]


def check_pools(market, pools: Sequence[Pool], thresholds: dict, now: float) -> list[PoolAlert]:
    """The alerts the market's offers and (if it keeps them) statistics raise now."""
    if all(value is None for value in thresholds.values()):
        return []
    offers = market.offers(list(pools), now)
    stats = market.stats(list(pools), now)
    return pool_alerts(offers, stats, **thresholds)


def announce(alerts: list[PoolAlert], context, callback: AlertCallback | None) -> None:
    """Each alert to the log, the ``on_spot_alert`` listeners and ``callback``."""
    ti = context.get("ti")
    where = {
        "dag_id": getattr(ti, "dag_id", ""),
        "run_id": getattr(ti, "run_id", ""),
        "task_id": getattr(ti, "task_id", ""),
        "map_index": getattr(ti, "map_index", -1),
    }
    hook = _listener_hook()
    for alert in alerts:
        if _first_in_a_while(alert):
            log.warning("spot pool alert: %s", alert.message)
        if hook is not None:
            hook.on_spot_alert(alert=alert.to_dict(), **where)
        if callback is not None:
            callback(alert.to_dict(), context)


LOG_EVERY_SECONDS = 3600.0
_logged_at: dict[tuple[str, str], float] = {}


def _first_in_a_while(alert: PoolAlert) -> bool:
    """Whether to log ``alert``: once per pool and kind per ``LOG_EVERY_SECONDS`` in this
    process. Every attempt end of every task checks the pools, so three mapped shards
    ending together logged each alert three times; the listeners and the callback still
    get every one (they may count or page)."""
    key = (alert.pool.key, alert.kind)
    last = _logged_at.get(key)
    if last is not None and alert.observed_at - last < LOG_EVERY_SECONDS:
        return False
    _logged_at[key] = alert.observed_at
    return True


def on_attempt_end(
    market_of: Callable[[], Any],
    pools_of: Callable[[], Sequence[Pool]],
    thresholds: dict,
    context,
    callback: AlertCallback | None,
) -> Callable[[JobRecord, Attempt], None]:
    """The persist callback's ``on_attempt_end``: check the job's pools, announce alerts."""

    def check(record: JobRecord, attempt: Attempt) -> None:
        announce(check_pools(market_of(), pools_of(), thresholds, time.time()), context, callback)

    return check


def _listener_hook():
    """Airflow's task-side listener manager with ``on_spot_alert`` added once."""
    try:
        from airflow.sdk.listener import get_listener_manager
    except ImportError:  # not in a Task SDK process
        return None
    from airflow_spot.listeners import spec

    manager = get_listener_manager()
    caller = getattr(manager.hook, "on_spot_alert", None)
    if caller is None or caller.spec is None:
        manager.add_hookspecs(spec)
    return manager.hook
