"""Figures over many JobRecords: what a fleet of spot jobs saved, lost and suffered per pool.

Pure: records in, frozen rows out, no clock and no I/O, so every engine's UI (the Airflow
Spot jobs page, a Prefect dashboard, a report) shows the same numbers for the same
records. Only what the records hold is counted: interruptions are attempts that ended
``preempted``, hours on spot are the spans of finished spot attempts in each record's
capacity time (the clock its costs are in: trace hours on the local cloud), a pool's
price is the price of the newest lease launched in it. Only jobs that can claim a saving
(not failed, not past their deadline) add to a group's saving.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypedDict

from spot_core.model import JobRecord, Outcome

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Savings:
    """Money of a group of jobs (a DAG's task, one day of it, ...)."""

    group: tuple[str, ...]
    jobs: int
    spent: float
    on_demand_equivalent: float
    lost_work_seconds: float
    preemptions: int
    # The saving of the group's jobs that may claim one, and their on-demand equivalent:
    # a failed or deadline-missed job spent money but saved nothing.
    claimed_saving: float = 0.0
    claimed_on_demand: float = 0.0
    unclaimed_jobs: int = 0

    @property
    def saved(self) -> float:
        return self.claimed_saving

    @property
    def savings_fraction(self) -> float:
        return self.claimed_saving / self.claimed_on_demand if self.claimed_on_demand > 0 else 0.0


@dataclass(frozen=True)
class PoolFigures:
    """One spot pool as the records saw it."""

    pool: str  # zone/instance type, e.g. "us-east-1a/p3.2xlarge"
    attempts: int
    interruptions: int
    spot_hours: float
    lost_work_seconds: float
    last_price_per_hour: float | None
    last_price_at: float | None

    @property
    def interruptions_per_hour(self) -> float | None:
        """Interruptions per capacity hour on spot in this pool (the clock of the pool
        alerts' "interruptions per spot hour"); None before any finished span."""
        return self.interruptions / self.spot_hours if self.spot_hours > 0 else None


def pool_name(zone: str, instance_type: str) -> str:
    return f"{zone}/{instance_type}"


def day_of(timestamp: float) -> str:
    """The UTC day (YYYY-MM-DD) a POSIX time falls on: the 'over time' axis of savings."""
    return datetime.fromtimestamp(timestamp, tz=UTC).strftime("%Y-%m-%d")


def savings_by(keyed: Iterable[tuple[tuple[str, ...], JobRecord]]) -> list[Savings]:
    """Sum each group's records. ``keyed`` pairs a group key (e.g. (dag_id, task_id) or
    (dag_id, task_id, day_of(record.created_at))) with a record; rows come sorted by key."""
    sums: dict[tuple[str, ...], Savings] = {}
    for key, record in keyed:
        group = tuple(key)
        row = sums.get(group) or Savings(group, 0, 0.0, 0.0, 0.0, 0)
        claimed = record.saving_claimed
        sums[group] = Savings(
            group,
            row.jobs + 1,
            row.spent + record.ledger.spent,
            row.on_demand_equivalent + record.ledger.on_demand_equivalent,
            row.lost_work_seconds + record.ledger.lost_work_seconds,
            row.preemptions + record.preemptions,
            row.claimed_saving + (claimed or 0.0),
            row.claimed_on_demand
            + (0.0 if claimed is None else record.ledger.on_demand_equivalent),
            row.unclaimed_jobs + (claimed is None),
        )
    return [sums[group] for group in sorted(sums)]


class _PoolRow(TypedDict):
    attempts: int
    interruptions: int
    hours: float
    lost: float
    price: float | None
    price_at: float | None


def pool_figures(records: Iterable[JobRecord]) -> list[PoolFigures]:
    """Per spot pool: attempts, interruptions, hours on spot (capacity hours, the clock
    of the costs beside them) and the newest lease price."""
    rows: dict[str, _PoolRow] = {}
    for record in records:
        for attempt in record.attempts:
            if not attempt.pool.is_spot:
                continue
            name = pool_name(attempt.pool.zone, attempt.pool.instance_type)
            row = rows.setdefault(
                name,
                {
                    "attempts": 0,
                    "interruptions": 0,
                    "hours": 0.0,
                    "lost": 0.0,
                    "price": None,
                    "price_at": None,
                },
            )
            row["attempts"] += 1
            row["interruptions"] += attempt.outcome is Outcome.PREEMPTED
            row["lost"] += attempt.lost_work_seconds
            if attempt.ended_at is not None:
                wall = max(0.0, attempt.ended_at - attempt.started_at)
                row["hours"] += wall * record.time_scale / SECONDS_PER_HOUR
            price = (attempt.lease or {}).get("price_per_hour")
            if price is not None and (
                row["price_at"] is None or attempt.started_at >= row["price_at"]
            ):
                row["price"], row["price_at"] = float(price), attempt.started_at
    return [
        PoolFigures(
            name,
            r["attempts"],
            r["interruptions"],
            r["hours"],
            r["lost"],
            r["price"],
            r["price_at"],
        )
        for name, r in sorted(rows.items())
    ]
