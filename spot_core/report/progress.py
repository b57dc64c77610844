"""How far a running job is, in words and a percentage: the terminal's live panel and the
Prefect progress artifact say the same thing."""

from __future__ import annotations

from spot_core.charts.clock import clock_of, money, saving
from spot_core.model import JobRecord, JobStatus


def attempt_line(record: JobRecord, now: float) -> str:
    """The newest attempt: where it runs and for how long, or how it ended."""
    attempt = record.attempts[-1] if record.attempts else None
    if attempt is None:
        return "no attempt yet"
    pool = attempt.pool
    if attempt.outcome is None:
        price = (attempt.lease or {}).get("price_per_hour")
        rate = f" at ${price:.3f}/h" if isinstance(price, (int, float)) else ""
        running = max(0.0, now - attempt.started_at) * record.time_scale
        return (
            f"attempt {attempt.number} running on {pool.zone} {pool.instance_type} "
            f"({pool.market}){rate} for {clock_of([record]).duration(running)}"
        )
    return (
        f"attempt {attempt.number} on {pool.zone} {pool.instance_type} ({pool.market}) "
        f"ended {attempt.outcome}"
    )


def saving_line(record: JobRecord) -> str:
    """What the closed attempts survived, spent and saved."""
    ledger = record.ledger
    clock = "" if record.time_scale == 1.0 else f" (capacity time, {record.time_scale:g}x)"
    running = record.status in (JobStatus.PENDING, JobStatus.RUNNING)
    saved = f"saved so far {saving(record, verb=False)}" if running else saving(record)
    return (
        f"preemptions {record.preemptions}, fallbacks {record.fallbacks}; spent "
        f"{money(ledger.spent)} vs on-demand {money(ledger.on_demand_equivalent)}{clock}: "
        f"{saved}"
    )


def progress_percent(record: JobRecord, total_steps: int | None = None) -> float:
    """100 once the job succeeded; before that, the last durable checkpoint's share of
    ``total_steps`` (capped at 99: the last step is not the job's end), or 0 when the
    job's length is unknown."""
    if record.status is JobStatus.SUCCEEDED:
        return 100.0
    if not total_steps or record.latest_checkpoint is None:
        return 0.0
    return min(99.0, 100.0 * record.latest_checkpoint.step / total_steps)
