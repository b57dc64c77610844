"""Prefect events for a spot job's transitions, so automations can act on them.

Every controller transition becomes ``spot.job.<what>``: ``launched``, ``preempted``,
``fallback`` (a launch on on-demand after spot), ``capacity-unavailable``,
``user-failed``, ``infrastructure-failed``, ``succeeded``, ``failed``, ``waiting``,
``rescheduled`` (the spot worker put a flow run back in its queue). The resource is the job (``spot.job.<job id>``); the payload
carries the attempt and the record's summary. Emitting never breaks the job.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from spot_core.model import JobRecord, Market

log = logging.getLogger(__name__)

EVENT_NAMES: dict[str, str | None] = {
    "launched": "spot.job.launched",
    "preempted": "spot.job.preempted",
    "capacity_unavailable": "spot.job.capacity-unavailable",
    "user_failed": "spot.job.user-failed",
    "infrastructure_failed": "spot.job.infrastructure-failed",
    "succeeded": "spot.job.succeeded",  # the attempt that succeeded ends the job
    "done": None,                       # the same news again, when the controller settles
    "failed": "spot.job.failed",
    "wait": "spot.job.waiting",
    "rescheduled": "spot.job.rescheduled",
}
FALLBACK = "spot.job.fallback"


def job_resource(record: JobRecord) -> dict[str, str]:
    return {"prefect.resource.id": f"spot.job.{record.job_id}",
            "prefect.resource.name": record.job_id, "prefect.resource.role": "spot-job"}


def events_for(kind: str, record: JobRecord) -> list[str]:
    """The event names one controller transition emits."""
    name = EVENT_NAMES.get(kind, f"spot.job.{kind.replace('_', '-')}")
    names = [] if name is None else [name]
    if kind == "launched" and _is_fallback(record):
        names.append(FALLBACK)
    return names


def emit_job_event(kind: str, record: JobRecord, detail: str = "",
                   related: Sequence[dict[str, str]] = ()) -> None:
    try:
        from prefect.events import emit_event

        attempt = record.attempts[-1] if record.attempts else None
        payload: dict[str, Any] = {"detail": detail[:500], "summary": record.summary(),
                                   "attempt": None if attempt is None else attempt.to_dict()}
        for name in events_for(kind, record):
            emit_event(event=name, resource=job_resource(record), related=list(related),
                       payload=payload)
    except Exception:  # noqa: BLE001 - an unreachable event stream must not fail the job
        log.warning("could not emit the %s event for %s", kind, record.job_id, exc_info=True)


def _is_fallback(record: JobRecord) -> bool:
    attempts = record.attempts
    return (len(attempts) >= 2 and attempts[-1].pool.market is Market.ON_DEMAND
            and attempts[-2].pool.market is Market.SPOT)
