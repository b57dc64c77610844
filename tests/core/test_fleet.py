"""spot_core.fleet: the figures the Spot jobs page shows, from records alone."""

from __future__ import annotations

from spot_core.fleet import day_of, pool_figures, savings_by
from spot_core.model import Attempt, JobRecord, Market, Outcome, Pool

A = Pool("aws", "us-east-1", "us-east-1a", "g5.xlarge", Market.SPOT)
B = Pool("aws", "us-east-1", "us-east-1b", "g5.xlarge", Market.SPOT)
T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC


def _lease(pool: Pool, number: int, start: float, price: float) -> dict:
    return {
        "lease_id": f"l-{number}",
        "pool": pool.to_dict(),
        "job_id": "j",
        "attempt": number,
        "started_at": start,
        "price_per_hour": price,
        "details": {},
    }


def _job(
    job_id: str, runs: list[tuple[Pool, float, float | None, Outcome | None, float]]
) -> JobRecord:
    record = JobRecord(job_id=job_id, created_at=T0)
    for number, (pool, start, hours, outcome, price) in enumerate(runs, 1):
        begun = Attempt(number, pool, start, lease=_lease(pool, number, start, price))
        record = record.start_attempt(begun)
        if outcome is not None:
            record = record.finish_attempt(
                Attempt(
                    number,
                    pool,
                    start,
                    lease=begun.lease,
                    ended_at=start + hours * 3600,
                    outcome=outcome,
                    cost=price * hours,
                    on_demand_cost=1.0 * hours,
                    lost_work_seconds=60.0 if outcome is Outcome.PREEMPTED else 0.0,
                )
            )
    return record


def test_pool_figures_count_interruptions_per_spot_hour_and_the_newest_price():
    first = _job(
        "a",
        [
            (A, T0, 2.0, Outcome.PREEMPTED, 0.30),
            (A.on(Market.ON_DEMAND), T0 + 7200, 1.0, Outcome.SUCCEEDED, 1.0),
        ],
    )
    second = _job(
        "b", [(A, T0 + 100, 2.0, Outcome.SUCCEEDED, 0.35), (B, T0 + 9000, None, None, 0.40)]
    )  # still running: no hours yet
    figures = {f.pool: f for f in pool_figures([first, second])}
    assert set(figures) == {"us-east-1a/g5.xlarge", "us-east-1b/g5.xlarge"}  # no on-demand
    a = figures["us-east-1a/g5.xlarge"]
    assert (a.attempts, a.interruptions, a.spot_hours, a.lost_work_seconds) == (2, 1, 4.0, 60.0)
    assert a.interruptions_per_hour == 0.25 and a.last_price_per_hour == 0.35
    b = figures["us-east-1b/g5.xlarge"]
    assert b.interruptions_per_hour is None and b.last_price_per_hour == 0.40


def test_savings_sum_per_group_and_day():
    first = _job("a", [(A, T0, 2.0, Outcome.SUCCEEDED, 0.25)])
    second = _job("b", [(A, T0, 4.0, Outcome.SUCCEEDED, 0.5)])
    rows = savings_by([(("dag", "train", day_of(r.created_at)), r) for r in (first, second)])
    assert len(rows) == 1 and rows[0].group == ("dag", "train", "2026-01-01")
    assert (rows[0].jobs, rows[0].spent, rows[0].on_demand_equivalent) == (2, 2.5, 6.0)
    assert rows[0].saved == 3.5 and round(rows[0].savings_fraction, 4) == 0.5833
