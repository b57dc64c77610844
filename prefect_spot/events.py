"""Prefect events for a spot job's transitions and its pools, so automations can act.

Every controller transition becomes ``spot.job.<what>`` on one resource per job,
``spot.job.<job id>`` (role ``spot-job``): ``launched``, ``notice`` (an interruption
notice arrived), ``resumed`` (a launch after an earlier attempt, from its last
checkpoint), ``fallback`` (a launch on on-demand after spot), ``preempted``,
``capacity-unavailable``, ``user-failed``,
``infrastructure-failed``, ``succeeded``, ``failed``, ``waiting``, ``rescheduled`` (the
spot worker put a flow run back in its queue). The payload carries ``metrics`` (the
numbers Airflow's Stats get: preemptions, fallbacks, attempts, spot cost, on-demand
equivalent, saved, lost work seconds, time to resume seconds, pool), the record's summary
and the attempt. ``handover``: a replacement launched on a notice, beside the old attempt.

A pool past an alert threshold (``alert_interruption_rate``, ``alert_spot_price``)
raises ``spot.pool.alert`` on ``spot.pool.<pool key>`` (role ``spot-pool``), the job
related. Emitting never breaks the job.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from spot_core.model import JobRecord, Market
from spot_core.policy.alerts import PoolAlert

log = logging.getLogger(__name__)

EVENT_NAMES: dict[str, str | None] = {
    "launched": "spot.job.launched",
    "preempted": "spot.job.preempted",
    "disrupted": "spot.job.disrupted",
    "capacity_unavailable": "spot.job.capacity-unavailable",
    "user_failed": "spot.job.user-failed",
    "infrastructure_failed": "spot.job.infrastructure-failed",
    "deadline_missed": "spot.job.deadline-missed",
    "succeeded": "spot.job.succeeded",  # the attempt that succeeded ends the job
    "done": None,  # the same news again, when the controller settles
    "failed": "spot.job.failed",
    "wait": "spot.job.waiting",
    "rescheduled": "spot.job.rescheduled",
}
FALLBACK = "spot.job.fallback"
RESUMED = "spot.job.resumed"
POOL_ALERT = "spot.pool.alert"


def job_resource(record: JobRecord) -> dict[str, str]:
    return {
        "prefect.resource.id": f"spot.job.{record.job_id}",
        "prefect.resource.name": record.job_id,
        "prefect.resource.role": "spot-job",
    }


def pool_resource(alert: PoolAlert) -> dict[str, str]:
    return {
        "prefect.resource.id": f"spot.pool.{alert.pool.key}",
        "prefect.resource.name": f"{alert.pool.zone} {alert.pool.instance_type}",
        "prefect.resource.role": "spot-pool",
    }


def events_for(kind: str, record: JobRecord) -> list[str]:
    """The event names one controller transition emits."""
    name = EVENT_NAMES.get(kind, f"spot.job.{kind.replace('_', '-')}")
    names = [] if name is None else [name]
    if kind == "launched" and len(record.attempts) >= 2:
        names.append(RESUMED)
    if kind == "launched" and _is_fallback(record):
        names.append(FALLBACK)
    return names


def job_metrics(record: JobRecord) -> dict[str, Any]:
    """The job's numbers as of this event (the same ones Airflow sends to Stats)."""
    ledger = record.ledger
    attempt = record.attempts[-1] if record.attempts else None
    return {
        "attempts": len(record.attempts),
        "preemptions": record.preemptions,
        "fallbacks": record.fallbacks,
        "user_failures": record.user_failures,
        "spot_cost": round(ledger.spent, 6),
        "on_demand_cost": round(ledger.on_demand_equivalent, 6),
        "saved": round(ledger.saved, 6),
        "savings_fraction": round(ledger.savings_fraction, 6),
        "lost_work_seconds": round(ledger.lost_work_seconds, 3),
        "pool": None if attempt is None else attempt.pool.key,
        "market": None if attempt is None else str(attempt.pool.market),
        "resumed_from_step": None if attempt is None else attempt.checkpoint_step_start,
        # spot.time_to_resume: the previous attempt's notice to this one's first step
        "time_to_resume_seconds": None if attempt is None else record.time_to_resume(attempt),
    }


def emit_job_event(
    kind: str, record: JobRecord, detail: str = "", related: Sequence[dict[str, str]] = ()
) -> None:
    try:
        from prefect.events import emit_event

        attempt = record.attempts[-1] if record.attempts else None
        payload: dict[str, Any] = {
            "detail": detail[:500],
            "metrics": job_metrics(record),
            "summary": record.summary(),
            "attempt": None if attempt is None else attempt.to_dict(),
        }
        for name in events_for(kind, record):
            emit_event(
                event=name, resource=job_resource(record), related=list(related), payload=payload
            )
    except Exception:  # noqa: BLE001 - an unreachable event stream must not fail the job
        log.warning("could not emit the %s event for %s", kind, record.job_id, exc_info=True)


def emit_pool_alerts(
    alerts: Sequence[PoolAlert], record: JobRecord, related: Sequence[dict[str, str]] = ()
) -> None:
    """One ``spot.pool.alert`` per alert, the job that saw it related."""
    try:
        from prefect.events import emit_event

        for alert in alerts:
            emit_event(
                event=POOL_ALERT,
                resource=pool_resource(alert),
                related=[job_resource(record), *related],
                payload=alert.to_dict(),
            )
    except Exception:  # noqa: BLE001 - as above: alerts never fail the job
        log.warning("could not emit pool alerts for %s", record.job_id, exc_info=True)


def _is_fallback(record: JobRecord) -> bool:
    attempts = record.attempts
    return (
        len(attempts) >= 2
        and attempts[-1].pool.market is Market.ON_DEMAND
        and attempts[-2].pool.market is Market.SPOT
    )
