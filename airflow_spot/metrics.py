"""Airflow ``Stats`` for spot jobs, emitted once per attempt end.

Through Airflow's own metrics facade (``airflow.sdk.observability.stats``), so StatsD,
DogStatsD and OpenTelemetry all receive them as configured in ``[metrics]``. Every metric
is tagged ``dag_id``, ``task_id`` and ``pool`` (zone/instance type) plus ``market``; plain
StatsD drops tags unless ``statsd_influxdb_enabled`` (or DogStatsD / OTel) carries them.

| name | kind | value |
|---|---|---|
| ``spot.attempts`` | counter | 1 per finished attempt (tag ``outcome``) |
| ``spot.preemptions`` | counter | 1 per attempt that ended preempted |
| ``spot.fallbacks`` | counter | 1 per attempt on on-demand right after one on spot |
| ``spot.cost`` | gauge | the attempt's cost, USD |
| ``spot.saved`` | gauge | its on-demand equivalent minus its cost, USD |
| ``spot.lost_work_seconds`` | gauge | work the attempt lost (redone by the next one) |
| ``spot.time_to_resume`` | gauge | s from the last attempt's notice to this one's first step |
"""

from __future__ import annotations

import re

from spot_core.model import Attempt, JobRecord, Market

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
METRIC_NAMES = (
    "spot.attempts",
    "spot.preemptions",
    "spot.fallbacks",
    "spot.cost",
    "spot.saved",
    "spot.lost_work_seconds",
    "spot.time_to_resume",
)


def _tag(value: object) -> str:
    """A tag value StatsD and InfluxDB line formats accept (no '/', ',', '=', ':')."""
    return _UNSAFE.sub("_", str(value))


def attempt_tags(dag_id: str, task_id: str, attempt: Attempt) -> dict[str, str]:
    return {
        "dag_id": _tag(dag_id),
        "task_id": _tag(task_id),
        "pool": _tag(f"{attempt.pool.zone}.{attempt.pool.instance_type}"),
        "market": _tag(attempt.pool.market),
    }


def emit_attempt_end(record: JobRecord, attempt: Attempt, *, dag_id: str, task_id: str) -> None:
    """The metrics of one attempt that just ended (``record`` is the record after it)."""
    from airflow.sdk.observability.stats import Stats

    tags = attempt_tags(dag_id, task_id, attempt)
    Stats.incr("spot.attempts", tags={**tags, "outcome": _tag(attempt.outcome)})
    if attempt.outcome == "preempted":
        Stats.incr("spot.preemptions", tags=tags)
    if _is_fallback(record, attempt):
        Stats.incr("spot.fallbacks", tags=tags)
    Stats.gauge("spot.cost", attempt.cost, tags=tags)
    Stats.gauge("spot.saved", attempt.on_demand_cost - attempt.cost, tags=tags)
    Stats.gauge("spot.lost_work_seconds", attempt.lost_work_seconds, tags=tags)
    resumed_in = record.time_to_resume(attempt)
    if resumed_in is not None:
        Stats.gauge("spot.time_to_resume", resumed_in, tags=tags)


def _is_fallback(record: JobRecord, attempt: Attempt) -> bool:
    """On-demand right after a spot attempt: the job fell back (JobRecord.fallbacks)."""
    earlier = [a for a in record.attempts if a.number < attempt.number]
    return (
        attempt.pool.market is Market.ON_DEMAND
        and bool(earlier)
        and earlier[-1].pool.market is Market.SPOT
    )
